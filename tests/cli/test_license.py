"""The repository ships the license its README and pyproject name (fresh-user trial, H17)."""

from __future__ import annotations

import hashlib
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
# md5 of https://www.apache.org/licenses/LICENSE-2.0.txt (the canonical text, 11357 bytes)
APACHE_2_MD5 = "86d3f3a95c324c9479bd8986968f4327"


def test_license_file_is_the_apache_2_text_pyproject_declares():
    text = (ROOT / "LICENSE").read_bytes()
    assert hashlib.md5(text).hexdigest() == APACHE_2_MD5
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    declared = project["license"]
    declared = declared if isinstance(declared, str) else declared.get("text", "")
    assert declared == "Apache-2.0"
    assert "Apache-2.0" in (ROOT / "README.md").read_text()
