"""JupyterLab's settings for the course (the README's command passes ``--config=jupyter_server_config.py``):
a notebook is saved without widget state, the kernel's Python version or progress-bar litter
(``helpers.notebook_files``)."""
from jupyter_server.services.contents.largefilemanager import AsyncLargeFileManager

import helpers.device  # noqa: F401  without a GPU it sets TRITON_INTERPRET=1 here, and the kernels this server
# starts inherit it: an exercise cell that imports triton before helpers, after a kernel restart, still gets
# the interpreter's triton.language
from helpers.notebook_files import clean


def clean_before_save(model: dict, **_) -> None:
    """Jupyter's pre-save hook: notebooks lose the metadata that only the editor wrote, and progress-bar litter."""
    if model.get("type") == "notebook" and isinstance(model.get("content"), dict):
        clean(model["content"])


class CleaningContentsManager(AsyncLargeFileManager):
    """Jupyter's default file manager with the course's pre-save hook registered once per manager.

    Jupyter reads this file twice (once for the server, once for JupyterLab), so setting the deprecated
    ``pre_save_hook`` option here would warn "Overriding existing pre_save_hook"; registering does not."""

    def __init__(self, **kwargs) -> None:
        super().__init__(**kwargs)
        self.register_pre_save_hook(clean_before_save)


c = get_config()  # noqa: F821  (Jupyter defines it while it reads this file)
c.ServerApp.contents_manager_class = CleaningContentsManager
