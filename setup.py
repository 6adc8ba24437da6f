"""Maps the design card's top-level folders onto one import root, `harnessrl`."""

from setuptools import find_packages, setup

FOLDERS = {"harnessrl": "harnessrl", "pipelines": "harnessrl.pipelines",
           "components": "harnessrl.components", "dataprep": "harnessrl.dataprep"}

packages: list[str] = []
package_dir: dict[str, str] = {}
for folder, root in FOLDERS.items():
    for sub in [""] + find_packages(folder):
        name = root + ("." + sub if sub else "")
        packages.append(name)
        package_dir[name] = folder + ("/" + sub.replace(".", "/") if sub else "")

setup(packages=packages, package_dir=package_dir)
