"""The package's floors: a module imports only from its own floor or the floors below it, so the Llama model
layer never reaches up into a notebook's study, the fine-tuning experiment or the exercises."""
import ast

import pytest

from helpers.results import REPO_ROOT

# lowest first; a module's floor is the first whose prefix names it
FLOORS = [
    ("foundation", ("helpers.device", "helpers.bench", "helpers.results", "helpers.datasheets", "helpers.monitor",
                    "helpers.plots", "helpers.children", "helpers.notebook_files", "helpers.ncu",
                    "helpers.card_fit")),
    ("kernels", ("helpers.kernels",)),
    ("model", ("helpers.llama",)),
    ("studies and experiment", ("helpers.studies", "helpers.finetune")),
    ("verdicts and exercises", ("helpers.claims", "helpers.exercises")),
]


def floor_of(module: str) -> int:
    if module == "helpers":
        return 0  # the package's __init__: the device and scale only
    for level, (_, prefixes) in enumerate(FLOORS):
        if any(module == p or module.startswith(p + ".") for p in prefixes):
            return level
    raise AssertionError(f"{module} is on no floor: add it to FLOORS")


def module_name(path) -> str:
    return ".".join(path.relative_to(REPO_ROOT).with_suffix("").parts).removesuffix(".__init__")


def imported(path) -> set[str]:
    """The helpers modules (or packages) that ``path`` imports, relative imports resolved."""
    name = module_name(path)
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    out = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            out |= {a.name for a in node.names if a.name.split(".")[0] == "helpers"}
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = package.split(".")[:len(package.split(".")) - (node.level - 1)]
                base = ".".join(parts + ([base] if base else []))
            if base.split(".")[0] != "helpers":
                continue
            for alias in node.names:  # `from helpers.x import y`: y may be a module of its own floor
                sub = f"{base}.{alias.name}"
                is_module = (REPO_ROOT / (sub.replace(".", "/") + ".py")).exists() or \
                    (REPO_ROOT / sub.replace(".", "/")).is_dir()
                out.add(sub if is_module else base)
    return out


MODULES = sorted((REPO_ROOT / "helpers").rglob("*.py"))


@pytest.mark.parametrize("path", MODULES, ids=[module_name(p) for p in MODULES])
def test_no_module_imports_from_a_floor_above_its_own(path):
    mine = floor_of(module_name(path))
    above = sorted(m for m in imported(path) if floor_of(m) > mine)
    assert not above, (f"{module_name(path)} (floor '{FLOORS[mine][0]}') imports {above} from a floor above it")


def test_the_rule_catches_an_upward_import(tmp_path, monkeypatch):
    fake = REPO_ROOT / "helpers" / "llama" / "decoding.py"
    monkeypatch.setattr(type(fake), "read_text", lambda self: "from ..studies import decoding_ladder\n")
    with pytest.raises(AssertionError, match="imports .*helpers.studies.decoding_ladder"):
        test_no_module_imports_from_a_floor_above_its_own(fake)
