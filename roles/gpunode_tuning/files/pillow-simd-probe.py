"""Report which PIL the venv imports: pillow-simd only when its metadata version is the one PIL reports."""

import contextlib
import importlib.metadata
import json
import sys

result = {
    "tag": "cp{}{}".format(*sys.version_info[:2]),
    "pil": None,
    "simd": None,
    "pillow": None,
    "marker": None,
    "features": {},
    "error": None,
}
# PIL.features names, as in gpunode_tuning_pillow_simd_features (JPEG and zlib are always built).
FEATURES = ("jpg", "zlib", "freetype2", "libtiff", "webp", "littlecms2", "jpg_2000")
for dist, key in (("pillow-simd", "simd"), ("pillow", "pillow")):
    with contextlib.suppress(importlib.metadata.PackageNotFoundError):
        result[key] = importlib.metadata.version(dist)
try:
    import PIL
    import PIL.Image  # the C extension must load too

    result["pil"] = PIL.__version__
    from PIL import features

    result["features"] = {name: bool(features.check(name)) for name in FEATURES}
except Exception as exc:  # any import failure means "not in place"
    result["error"] = repr(exc)
with contextlib.suppress(OSError), open(sys.argv[1], encoding="utf-8") as fh:
    result["marker"] = fh.read().strip()
print(json.dumps(result))
