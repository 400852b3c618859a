"""JupyterLab's settings for the course (the README's command passes ``--config=jupyter_server_config.py``):
a notebook is saved without widget state, the kernel's Python version or progress-bar litter
(``helpers.notebook_files``)."""
from helpers.notebook_files import clean


def clean_before_save(model: dict, **_) -> None:
    """Jupyter's pre-save hook: notebooks lose the metadata that only the editor wrote, and progress-bar litter."""
    if model.get("type") == "notebook" and isinstance(model.get("content"), dict):
        clean(model["content"])


c = get_config()  # noqa: F821  (Jupyter defines it while it reads this file)
c.FileContentsManager.pre_save_hook = clean_before_save
