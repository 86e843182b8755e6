# expect: error
# Asks numpy for 20 GB: the address-space limit turns it into a MemoryError.
import numpy as np

def transform(grid):
    big = np.ones((50_000, 50_000))
    return big[:3, :3].astype(int).tolist()
