"""Writes the seed images of the fuzz suites (tests/fuzz_files.rs) and
PIL's verdict on damaged copies of them.

Small images of kinds the other fixtures lack, each a starting point
for the mutator: a progressive JPEG, a gray JPEG, a JPEG with restart
markers, a 16-bit PNG, a palette PNG with transparency, an interlaced
PNG and a gray BMP. Also `pil_truncated.json`: for cuts of the JPEG and
PNG seeds, whether PIL (`Image.open(...).load()`, default settings)
raises, which tests/fuzz_files.rs checks leangrad agrees with. Needs
`pillow` and `numpy`. Run from the repository root:

    python3 python-compare/fuzz_seeds.py
"""

import io
import json
import os

import numpy as np
from PIL import Image

OUT = os.path.join("tests", "fixtures", "fuzz", "seeds")


def pattern(h, w, c):
    y, x, ch = np.meshgrid(np.arange(h), np.arange(w), np.arange(c), indexing="ij")
    return ((x * 37 + y * 11 + ch * 80) % 256).astype(np.uint8)


def main():
    os.makedirs(OUT, exist_ok=True)
    rgb = Image.fromarray(pattern(24, 20, 3), "RGB")
    rgb.save(os.path.join(OUT, "progressive.jpg"), quality=80, progressive=True)
    rgb.convert("L").save(os.path.join(OUT, "gray.jpg"), quality=80)
    # A restart interval of one MCU row (PIL's `restart_marker_rows`).
    rgb.save(os.path.join(OUT, "restarts.jpg"), quality=80, restart_marker_rows=1)
    sixteen = (pattern(7, 5, 1)[..., 0].astype(np.uint16) * 257).astype(np.uint16)
    Image.fromarray(sixteen).save(os.path.join(OUT, "gray16.png"))
    pal = rgb.convert("P", palette=Image.Palette.ADAPTIVE, colors=8)
    pal.info["transparency"] = 0
    pal.save(os.path.join(OUT, "palette.png"), transparency=0)
    rgb.save(os.path.join(OUT, "interlaced.png"), interlace=1)
    rgb.convert("L").save(os.path.join(OUT, "gray.bmp"))

    verdicts = {}
    for name in ["progressive.jpg", "gray.jpg", "restarts.jpg", "interlaced.png"]:
        data = open(os.path.join(OUT, name), "rb").read()
        cuts = {}
        for keep in range(len(data) // 2, len(data), max(1, len(data) // 40)):
            try:
                Image.open(io.BytesIO(data[:keep])).load()
                cuts[str(keep)] = "decodes"
            except Exception as e:  # noqa: BLE001 - PIL raises OSError/SyntaxError
                cuts[str(keep)] = type(e).__name__
        verdicts[name] = cuts
    with open(os.path.join(OUT, "pil_truncated.json"), "w") as f:
        json.dump(verdicts, f, indent=1, sort_keys=True)


if __name__ == "__main__":
    main()
