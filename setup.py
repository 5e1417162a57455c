"""Packaging for cxr_audit (nbdev 2 layout): every field comes from settings.ini."""
from configparser import ConfigParser
from pathlib import Path

import setuptools

cfg = ConfigParser(delimiters=["="])
cfg.read(Path(__file__).parent / "settings.ini", encoding="utf-8")
cfg = cfg["DEFAULT"]

expected = ["version", "description", "keywords", "author", "author_email", "license",
            "status", "min_python", "audience", "language", "lib_name", "user", "git_url"]
missing = [k for k in expected if k not in cfg]
if missing: raise ValueError(f"settings.ini is missing: {missing}")

licenses = {"apache2": ("Apache Software License 2.0", "OSI Approved :: Apache Software License")}
statuses = ["1 - Planning", "2 - Pre-Alpha", "3 - Alpha", "4 - Beta", "5 - Production/Stable",
            "6 - Mature", "7 - Inactive"]
py_versions = "3.10 3.11 3.12 3.13".split()
lic = licenses.get(cfg["license"].lower(), (cfg["license"], None))
min_python = cfg["min_python"]

def _split(key): return cfg.get(key, "").split()

requirements = _split("requirements")
dev_requirements = _split("dev_requirements")
extras = {k.removeprefix("extra_"): _split(k) for k in cfg if k.startswith("extra_")}
extras["dev"] = sorted(set(dev_requirements) | {r for k in ("generate", "dicom", "nlp", "llm", "metrics", "radeval") for r in extras[k]})
extras["docs"] = sorted(set(extras["docs"]) | {r for k in ("metrics", "llm", "nlp") for r in extras[k]})
extras["all"] = sorted({r for k, v in extras.items() if k != "all" for r in v})
scripts = [s for s in cfg.get("console_scripts", "").split("\n") if s.strip()]

setuptools.setup(
    name=cfg["lib_name"],
    version=cfg["version"],
    license=lic[0],
    classifiers=[
        "Development Status :: " + statuses[int(cfg["status"])],
        "Intended Audience :: " + cfg["audience"].title(),
        "Natural Language :: " + cfg["language"].title(),
        "Topic :: Scientific/Engineering :: Medical Science Apps.",
    ] + [f"Programming Language :: Python :: {v}" for v in py_versions[py_versions.index(min_python):]]
      + ([f"License :: {lic[1]}"] if lic[1] else []),
    url=cfg["git_url"] if cfg["git_url"].startswith("http") else None,   # no hosted repository: no URL
    packages=setuptools.find_packages(include=["cxr_audit", "cxr_audit.*"]),
    include_package_data=True,
    package_data={"cxr_audit": ["resources/*", "resources/**/*"]},
    install_requires=requirements,
    extras_require=extras,
    python_requires=">=" + min_python,
    long_description=(Path(__file__).parent / "README.md").read_text(encoding="utf-8"),
    long_description_content_type="text/markdown",
    zip_safe=False,
    entry_points={"console_scripts": scripts, "nbdev": [f"{cfg['lib_name']}={cfg['lib_name']}._modidx:d"]},
    author=cfg["author"],
    author_email=cfg["author_email"],
    description=cfg["description"],
    keywords=cfg["keywords"],
)
