# The astropy-helpers release whose ah_bootstrap.py is this commit's, unpacked where its git
# submodule (on GitHub, out of reach here) would be: the newest such release on PyPI.
import hashlib, io, json, sys, tarfile, urllib.request

want = hashlib.sha256(open("ah_bootstrap.py", "rb").read()).hexdigest()
index = urllib.request.Request(
    "https://pypi.org/simple/astropy-helpers/",
    headers={"Accept": "application/vnd.pypi.simple.v1+json"},
)
files = [
    f for f in json.load(urllib.request.urlopen(index))["files"]
    if f["filename"].endswith(".tar.gz") and not f.get("yanked")
]
files.sort(key=lambda f: f.get("upload-time", ""), reverse=True)
for f in files:
    sdist = tarfile.open(fileobj=io.BytesIO(urllib.request.urlopen(f["url"]).read()))
    top = sdist.getnames()[0].split("/")[0]
    try:
        got = hashlib.sha256(sdist.extractfile(top + "/ah_bootstrap.py").read()).hexdigest()
    except KeyError:
        continue
    if got == want:
        for m in sdist.getmembers():
            if m.name.startswith(top + "/"):
                m.name = "astropy_helpers/" + m.name[len(top) + 1:]
                sdist.extract(m, ".")
        print("astropy_helpers: " + f["filename"] + " from PyPI")
        break
else:
    sys.exit("no astropy-helpers release on PyPI carries this commit's ah_bootstrap.py")
