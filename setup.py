"""Package list for setuptools: the top-level folders ir/, support/, dialect/, frontends/, passes/, targets/, tools/ become passctl.*."""

from setuptools import find_packages, setup

_ROOTS = ("ir", "support", "dialect", "frontends", "passes", "targets", "tools")
packages = ["passctl"] + [
    f"passctl.{name}" for name in find_packages(include=[f"{root}*" for root in _ROOTS])
]
setup(packages=packages, package_data={"passctl.ir": ["*.json"]})
