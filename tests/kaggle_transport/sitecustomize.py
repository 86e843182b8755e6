"""Kaggle's API answered inside the `kaggle` CLI process that tests/kaggle_client.py starts (PYTHONPATH names this
folder, so Python imports this module at start-up).

Only the network call is replaced: `requests.adapters.HTTPAdapter.send`, which every request of the client goes
through (kagglesdk's JSON calls and the blob upload's `requests.Session().put`). Each request is appended to
$FAKE_KAGGLE_LOG as one JSON line and answered as api.kaggle.com would (endpoints and field names from kagglesdk
0.1.38's services and types):
- POST /v1/datasets.DatasetApiService/GetDatasetStatus: 404 (the slug is free; dataset_create_new checks it first);
- POST /v1/blobs.BlobApiService/StartBlobUpload: a token and a create URL for the announced blob;
- PUT <create URL>: the whole body read and saved under the blob's name in $FAKE_KAGGLE_BLOBS, 200;
- POST /v1/datasets.DatasetApiService/CreateDataset and .../CreateDatasetVersion: status "ok" with the dataset's URL.
Any other request, a resumed upload, a blob whose size differs from the announced one, or a socket opened another way
ends the process at once with status 97 (an exception could be swallowed: upload_complete retries on any error).
At exit the client's own facts are logged: where `kaggle` was imported from, its version and its ignore patterns.
"""

import atexit
import hashlib
import json
import os
import socket
import sys

if os.environ.get("FAKE_KAGGLE_LOG"):
    import requests.adapters
    from requests.models import Response
    from requests.structures import CaseInsensitiveDict

    LOG = os.environ["FAKE_KAGGLE_LOG"]
    BLOBS = os.environ["FAKE_KAGGLE_BLOBS"]
    API = "https://api.kaggle.com/v1/"
    UPLOADS = "https://upload.kaggle-fake.invalid/blob/"
    DATASETS = "datasets.DatasetApiService/"
    _started: dict[str, dict] = {}  # create URL -> the StartBlobUpload request

    def _log(entry: dict) -> None:
        with open(LOG, "a") as f:
            f.write(json.dumps(entry) + "\n")

    def _fail(why: str, entry: dict | None = None) -> None:
        _log({"unexpected": why, **(entry or {})})
        sys.stderr.write(f"fake Kaggle API: {why}\n")
        sys.stderr.flush()
        os._exit(97)

    def _answer(request, status: int, payload: dict) -> Response:
        response = Response()
        response.status_code = status
        response.reason = {200: "OK", 404: "Not Found"}[status]
        response.headers = CaseInsensitiveDict({"Content-Type": "application/json"})
        response._content = json.dumps(payload).encode()
        response.encoding = "utf-8"
        response.url = request.url
        response.request = request
        return response

    def _receive(request) -> dict:
        """The PUT's whole body, saved under the name its StartBlobUpload announced."""
        start = _started.get(request.url)
        if start is None or "Content-Range" in request.headers or os.path.exists(os.path.join(BLOBS, start["name"])):
            _fail("a PUT to an unknown URL, a resumed upload or a second blob of one name",
                  {"method": "PUT", "url": request.url})
        body, size, digest = request.body, 0, hashlib.sha256()
        with open(os.path.join(BLOBS, start["name"]), "wb") as out:
            chunks = iter(lambda: body.read(1 << 20), b"") if hasattr(body, "read") else [body or b""]
            for chunk in chunks:
                out.write(chunk)
                size += len(chunk)
                digest.update(chunk)
        if size != start["contentLength"]:
            _fail(f"{start['name']}: {size} bytes sent, {start['contentLength']} announced")
        return {"method": "PUT", "url": request.url, "name": start["name"], "bytes": size,
                "sha256": digest.hexdigest()}

    def _send(self, request, stream=False, timeout=None, verify=True, cert=None, proxies=None):
        if request.method == "PUT" and request.url.startswith(UPLOADS):
            _log(_receive(request))
            return _answer(request, 200, {})
        if request.method != "POST" or not request.url.startswith(API):
            _fail(f"{request.method} {request.url}", {"method": request.method, "url": request.url})
        endpoint = request.url[len(API):]
        body = json.loads(request.body or b"{}")
        if endpoint == f"{DATASETS}GetDatasetStatus":
            status, answer = 404, {"code": 404, "message": "Not found"}
        elif endpoint == "blobs.BlobApiService/StartBlobUpload":
            url = f"{UPLOADS}{len(_started)}"
            _started[url] = body
            status, answer = 200, {"token": f"fake-token-{len(_started)}", "createUrl": url}
        elif endpoint in (f"{DATASETS}CreateDataset", f"{DATASETS}CreateDatasetVersion"):
            owner, slug = body["ownerSlug"], body.get("slug") or body["datasetSlug"]
            status, answer = 200, {"ref": f"{owner}/{slug}", "status": "ok",
                                   "url": f"https://www.kaggle.com/datasets/{owner}/{slug}"}
        else:
            _fail(f"POST {endpoint}: not an endpoint of a dataset upload", {"endpoint": endpoint})
        _log({"method": "POST", "endpoint": endpoint, "json": body, "status": status, "answer": answer})
        return _answer(request, status, answer)

    def _no_socket(*args, **kwargs):
        _fail("a socket was opened outside requests' transport")

    def _facts() -> None:
        kaggle = sys.modules.get("kaggle")
        extended = sys.modules.get("kaggle.api.kaggle_api_extended")
        _log({"client": {"file": getattr(kaggle, "__file__", None), "version": getattr(kaggle, "__version__", None),
                         "ignore_patterns": getattr(extended, "DEFAULT_IGNORE_PATTERNS", None)}})

    requests.adapters.HTTPAdapter.send = _send
    socket.socket.connect = _no_socket
    socket.create_connection = _no_socket
    atexit.register(_facts)
