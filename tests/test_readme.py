"""The README stays in sync with the CLI: every subcommand is in its "which command" table, and every command
line it shows names a real subcommand with real flags."""

import os
import re

import pytest

from jaxbert.cli import build_parser, main

README = open(os.path.join(os.path.dirname(__file__), "..", "README.md"), encoding="utf-8").read()
# The benchmark history README's Benchmark section points to: its prose names flags too.
HISTORY = open(os.path.join(os.path.dirname(__file__), "..", "benchmarks", "README.md"), encoding="utf-8").read()
SUBCOMMANDS = build_parser()._subparsers._group_actions[0].choices


def _command_lines() -> list[str]:
    """Lines of README code blocks that run jaxbert (`$ jaxbert ...` or `jaxbert ...`, usage forms included)."""
    lines, inside = [], False
    for line in README.splitlines():
        if line.startswith("```"):
            inside = not inside
        elif inside and (m := re.match(r"^(?:\$ )?(jaxbert [a-z-]+.*)$", line.strip())) and ": error:" not in line:
            lines.append(m.group(1))
    return lines


def test_every_subcommand_is_in_the_table():
    table = README.split("## Which command do I need", 1)[1].split("\n## ", 1)[0]
    assert set(SUBCOMMANDS) == set(re.findall(r"`jaxbert ([a-z-]+)", table))


@pytest.mark.parametrize("line", _command_lines())
def test_readme_commands_name_real_subcommands_and_flags(line, capsys):
    sub = line.split()[1]
    assert sub in SUBCOMMANDS, line
    with pytest.raises(SystemExit) as done:
        main([sub, "--help"])
    assert done.value.code == 0
    helptext = capsys.readouterr().out
    for flag in re.findall(r"(?<![\w-])--[a-z][a-z0-9-]*", line):
        assert flag in helptext, f"{flag} of README line {line!r} is not an option of jaxbert {sub}"


def _options(sub: str) -> set[str]:
    return {o for a in SUBCOMMANDS[sub]._actions for o in a.option_strings}


# Flags the README names of other programs: ruff, the benchmark script, Slurm's #SBATCH, gcloud.
FOREIGN = {"--check", "--fix", "--section", "--shape", "--repeats", "--mix-texts"}
FOREIGN |= {"--nodes", "--ntasks-per-node", "--gpus-per-node", "--zone", "--worker", "--command"}


def test_every_flag_the_readme_names_is_an_option_of_some_subcommand():
    """Prose names flags too (`--targets`, `--handle-impossible-answer`, `--dtype int8` on embed ...): each must be
    an option of a jaxbert subcommand (XLA's `--xla_...` flags aside)."""
    known = set().union(*(_options(sub) for sub in SUBCOMMANDS)) | FOREIGN
    named = set(re.findall(r"(?<![\w-])--[a-z][a-z0-9-]*(?![\w])", README + HISTORY))
    assert named - known == set()
    benchmark = open(os.path.join(os.path.dirname(__file__), "..", "scripts", "benchmark.py"), encoding="utf-8").read()
    assert all(f'"{flag}"' in benchmark for flag in ("--section", "--shape", "--repeats", "--mix-texts"))


def test_inline_commands_name_their_subcommands_options():
    """An inline `jaxbert SUB ... --flag` (or `SUB --flag`) in the prose names an option of SUB itself."""
    names = "|".join(map(re.escape, sorted(SUBCOMMANDS, key=len, reverse=True)))
    spans = re.findall(rf"`(?:jaxbert )?((?:{names}) [^`]*)`", README + HISTORY)
    assert len(spans) > 10
    for span in spans:
        sub = span.split()[0]
        for flag in re.findall(r"(?<![\w-])--[a-z][a-z0-9-]*(?![\w])", span):
            assert flag in _options(sub), f"{flag} of README's `{span}` is not an option of jaxbert {sub}"


def test_the_layout_section_names_every_module():
    """README's Layout lists jaxbert/'s modules and train/'s: a module added without a line there is caught."""
    layout = README.split("\n## Layout\n", 1)[1]
    package = os.path.join(os.path.dirname(__file__), "..", "jaxbert")
    top = {f for f in os.listdir(package) if f.endswith(".py") and not f.startswith("__")}
    assert {f for f in top if f"`{f}`" not in layout} == set()
    train_list = layout.split("`train/` (", 1)[1].split(")", 1)[0]
    train = {f[:-3] for f in os.listdir(os.path.join(package, "train")) if f.endswith(".py") and f != "__init__.py"}
    assert train - set(re.findall(r"\w+", train_list)) == set()
