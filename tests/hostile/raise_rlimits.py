# expect: error
# layers: seccomp
# Lifts its own CPU limit (root may raise hard limits), then loops.
import resource

def transform(grid):
    resource.setrlimit(resource.RLIMIT_CPU, (resource.RLIM_INFINITY, resource.RLIM_INFINITY))
    while True:
        pass
