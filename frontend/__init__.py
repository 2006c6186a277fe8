"""Templates, static files and Plotly figure builders for benchlab's pages."""
from pathlib import Path

TEMPLATE_DIR = Path(__file__).parent / "templates"
STATIC_DIR = Path(__file__).parent / "static"


def plotly_js_path() -> Path:
    """plotly.min.js from the installed plotly package: pages work offline, no CDN."""
    import plotly

    return Path(plotly.__file__).parent / "package_data" / "plotly.min.js"
