"""Synthetic text images (Pillow's bundled font, tests/data/sentences.txt) as PP-OCR inputs."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Dict, List

import numpy as np

SENTENCES = Path(__file__).resolve().parents[2] / "data" / "sentences.txt"
DET_MEAN = np.array([0.485, 0.456, 0.406], np.float32)
DET_STD = np.array([0.229, 0.224, 0.225], np.float32)
"""PP-OCR det preprocessing (RapidOCR's ``DetPreProcess``: ImageNet mean/std on RGB in [0, 1])."""


def _lines(count: int, seed: int) -> List[str]:
    lines = [s.strip() for s in SENTENCES.read_text().splitlines() if s.strip()]
    rng = np.random.default_rng(seed)
    return [lines[i] for i in rng.integers(0, len(lines), count)]


def text_image(height: int, width: int, seed: int, lines: int = 3) -> np.ndarray:
    """uint8 RGB ``[height, width, 3]``: dark text lines at seeded positions and sizes on a light,
    slightly noisy background."""
    from PIL import Image, ImageDraw, ImageFont

    rng = np.random.default_rng(seed)
    background = tuple(int(v) for v in rng.integers(200, 256, 3))
    image = Image.new("RGB", (width, height), background)
    draw = ImageDraw.Draw(image)
    for k, text in enumerate(_lines(lines, seed)):
        size = int(rng.integers(max(8, height // 12), max(10, height // 5)))
        font = ImageFont.load_default(size=size)
        y = int(k * height / lines + rng.integers(0, max(1, height // (3 * lines))))
        x = int(rng.integers(0, max(1, width // 8)))
        draw.text((x, y), text, fill=tuple(int(v) for v in rng.integers(0, 80, 3)), font=font)
    noise = rng.normal(0, 4, (height, width, 3))
    return np.clip(np.asarray(image, np.float32) + noise, 0, 255).astype(np.uint8)


def det_input(height: int = 64, width: int = 64, seed: int = 0) -> Dict[str, np.ndarray]:
    """PP-OCR det feed ``{"x": float32 [1, 3, height, width]}`` (sides multiples of 32)."""
    rgb = text_image(height, width, seed).astype(np.float32) / 255.0
    x = ((rgb - DET_MEAN) / DET_STD).transpose(2, 0, 1)[None]
    return {"x": np.ascontiguousarray(x, np.float32)}


def cls_input(seed: int = 0, height: int = 48, width: int = 192) -> Dict[str, np.ndarray]:
    """PP-OCR cls feed ``{"x": float32 [1, 3, 48, 192]}``: one text line, normalized as
    ``(x / 255 - 0.5) / 0.5``."""
    rgb = text_image(height, width, seed, lines=1).astype(np.float32) / 255.0
    x = ((rgb - 0.5) / 0.5).transpose(2, 0, 1)[None]
    return {"x": np.ascontiguousarray(x, np.float32)}


def write_feeds(folder: Path, feeds: List[Dict[str, np.ndarray]]) -> Path:
    """One ``.npz`` per feed in ``folder`` (the ``calib=`` format); returns ``folder``."""
    folder.mkdir(parents=True, exist_ok=True)
    for i, feed in enumerate(feeds):
        np.savez(folder / f"feed_{i:03d}.npz", **feed)
    return folder


def main(argv: List[str]) -> int:
    """``python tests/passes/quantize/ocr_images.py FOLDER COUNT SIZE``: COUNT PP-OCR det
    calibration feeds of SIZE x SIZE synthetic text images (seeds 0, 1, ...) as ``.npz`` files."""
    if len(argv) != 3 or not argv[1].isdigit() or not argv[2].isdigit() or int(argv[2]) % 32:
        print("usage: ocr_images.py FOLDER COUNT SIZE (SIZE a multiple of 32)", file=sys.stderr)
        return 2
    folder, count, size = Path(argv[0]), int(argv[1]), int(argv[2])
    write_feeds(folder, [det_input(size, size, seed) for seed in range(count)])
    print(f"{folder}: {count} feeds of [1, 3, {size}, {size}]")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
