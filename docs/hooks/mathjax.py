"""MkDocs hook: MathJax served with the site, so formulas render offline.

The ``docs`` extra installs ``django-static-mathjax``: a copy of MathJax 3 whose Python package,
``mathjax``, holds only the files (nothing of Django is imported or needed). This hook adds its
single-file bundle ``es5/tex-mml-chtml.js`` and the CommonHTML fonts that the bundle loads from
beside itself to the site under ``assets/mathjax/``; ``mkdocs.yml`` loads the bundle on every
page. Without the package the build stops with the command that installs it.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

from mkdocs.config.defaults import MkDocsConfig
from mkdocs.exceptions import PluginError
from mkdocs.structure.files import File, Files

TARGET = "assets/mathjax"  # mkdocs.yml's extra_javascript names TARGET/tex-mml-chtml.js
FONTS = "output/chtml/fonts/woff-v2"  # where the bundle looks for its fonts, beside itself


def _bundle_root() -> Path:
    spec = importlib.util.find_spec("mathjax")
    root = None if spec is None or spec.origin is None else Path(spec.origin).parent
    es5 = None if root is None else root / "static" / "mathjax" / "es5"
    if es5 is None or not (es5 / "tex-mml-chtml.js").is_file():
        raise PluginError(
            "MathJax is served with the site from the django-static-mathjax package, which is "
            'not installed: pip install -e ".[docs]"'
        )
    return es5


def on_files(files: Files, config: MkDocsConfig) -> Files:
    es5 = _bundle_root()
    for path in [es5 / "tex-mml-chtml.js", *sorted((es5 / FONTS).glob("*.woff"))]:
        uri = f"{TARGET}/{path.relative_to(es5).as_posix()}"
        files.append(File.generated(config, uri, abs_src_path=str(path)))
    return files
