"""JupyterLab's settings for the course (the README's command passes ``--config=jupyter_server_config.py``):
a notebook is saved without widget state or the kernel's Python version (``helpers.notebook_files``)."""
from helpers.notebook_files import clean_metadata


def clean_before_save(model: dict, **_) -> None:
    """Jupyter's pre-save hook: notebooks lose the metadata that only the editor wrote."""
    if model.get("type") == "notebook" and isinstance(model.get("content"), dict):
        clean_metadata(model["content"])


c = get_config()  # noqa: F821  (Jupyter defines it while it reads this file)
c.FileContentsManager.pre_save_hook = clean_before_save
