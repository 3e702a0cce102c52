"""remat-explorer's own namespace for its dashboard: `remat_explorer.widgets` (notebook and
Voila widgets) and `remat_explorer.apps` (the Voila app behind `remat-explorer app`).

Installed, both live in this package (pyproject.toml maps the repository's `widgets/` and
`apps/` folders here), so the distribution adds no top-level `widgets` or `apps` to
site-packages. In a checkout they stay where they are, at the top of the repository, and
this package also searches there.
"""

from pathlib import Path

_checkout = Path(__file__).resolve().parent.parent
if (_checkout / "pyproject.toml").is_file() and (_checkout / "widgets" / "__init__.py").is_file():
    __path__.append(str(_checkout))  # noqa: F821 (a package's own search path)
