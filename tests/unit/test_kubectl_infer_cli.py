"""``kubectl infer``'s command line and shell completion (kubectl_infer/cli.py), and
how it finds its kubeconfig (kubectl_infer/kubeconfig.py): no cluster involved."""

from __future__ import annotations

import io
from pathlib import Path

import pytest
import yaml

from kubectl_infer import kubeconfig
from kubectl_infer.cli import complete_main, completion_of, parser
from kubectl_infer.runview import Exit


@pytest.mark.parametrize(
    "argv",
    [
        ["-n", "ns", "--context", "c", "--kubeconfig", "k", "logs", "r"],
        ["logs", "r", "-n", "ns", "--context", "c", "--kubeconfig", "k"],
        ["--kubeconfig", "k", "logs", "--namespace=ns", "r", "--context=c"],
    ],
)
def test_connection_flags_go_anywhere_on_the_line(argv: list[str]) -> None:
    args = parser().parse_args(argv)
    assert (args.namespace, args.context, args.kubeconfig, args.run) == ("ns", "c", "k", "r")


def test_connection_flags_left_out_stay_unset() -> None:
    args = parser().parse_args(["list"])
    assert (args.namespace, args.context, args.kubeconfig) == (None, None, None)


def test_completion_knows_what_each_word_can_be() -> None:
    assert completion_of(["l"]).answer([]) == "logs\nlist\n:4\n"  # in --help's order
    assert completion_of(["-n", "x", "watch", "b"]).kind == "runs"
    assert completion_of(["-n", "x", "watch", "b"]).connection == {"namespace": "x"}
    assert completion_of(["watch", "r1", ""]).kind is None  # one run only
    deleting = completion_of(["delete", "r1", ""])
    assert (deleting.kind, deleting.exclude) == ("runs", {"r1"})
    assert deleting.answer(["r1", "r2"]) == "r2\n:4\n"
    assert completion_of(["submit", ""]).kind == "configs"
    assert completion_of(["list", "-o", ""]).words == ["json", "yaml", "name"]
    assert completion_of(["--context", ""]).kind == "contexts"
    kubeconfig = completion_of(["--kubeconfig", ""])
    assert (kubeconfig.kind, kubeconfig.directive) == ("files", 0)
    assert completion_of(["submit", "-p", ""]).kind is None  # no idea what a parameter is
    flags = completion_of(["logs", "--"]).words
    assert {"--follow", "--shard", "--prefix", "--namespace", "--context"} <= set(flags)


def test_completion_writes_cobras_format(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("KUBECONFIG", str(write(tmp_path / "k", contexts=["one", "two"])))
    out = io.StringIO()
    assert complete_main(["--context", "t"], out) == 0
    assert out.getvalue() == "two\n:4\n"


def write(path: Path, *, contexts: list[str], current: str | None = None) -> Path:
    config = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": "c", "cluster": {"server": "https://127.0.0.1:6443"}}],
        "users": [{"name": "u", "user": {"token": "t"}}],
        "contexts": [
            {"name": n, "context": {"cluster": "c", "user": "u", "namespace": f"ns-{n}"}}
            for n in contexts
        ],
    }
    if current:
        config["current-context"] = current
    path.write_text(yaml.safe_dump(config))
    return path


async def test_the_first_file_to_set_a_current_context_wins_and_empty_files_are_skipped(
    tmp_path: Path,
) -> None:
    a = write(tmp_path / "a", contexts=["one"], current="one")
    b = write(tmp_path / "b", contexts=["two"], current="two")
    empty = tmp_path / "empty"
    empty.write_text("")
    found = await kubeconfig.load(
        kubeconfig=None, context=None, environ={"KUBECONFIG": f"{empty}:{a}:{b}"}
    )
    assert found.namespace == "ns-one"
    assert found.configuration.host == "https://127.0.0.1:6443"
    other = await kubeconfig.load(
        kubeconfig=None, context="two", environ={"KUBECONFIG": f"{a}:{b}"}
    )
    assert other.namespace == "ns-two"
    assert kubeconfig.context_names(None, {"KUBECONFIG": f"{a}:{b}"}) == ["one", "two"]


@pytest.mark.parametrize(
    ("text", "context", "code", "says"),
    [
        (None, None, Exit.NO_KUBECONFIG, "does not exist"),
        ("clusters: [", None, Exit.BAD_KUBECONFIG, "cannot be read"),
        ("just a string", None, Exit.BAD_KUBECONFIG, "is not a kubeconfig"),
        ("clusters: 3", None, Exit.BAD_KUBECONFIG, "is not a kubeconfig"),
        ("contexts: []", None, Exit.NO_CONTEXT, "sets no current-context"),
        ("contexts: []\ncurrent-context: x", None, Exit.NO_CONTEXT, "current-context 'x'"),
        ("contexts: []", "y", Exit.NO_CONTEXT, "--context 'y' is not in"),
    ],
)
async def test_each_kubeconfig_problem_has_its_exit_code(
    tmp_path: Path, text: str | None, context: str | None, code: Exit, says: str
) -> None:
    path = tmp_path / "config"
    if text is not None:
        path.write_text(text)
    with pytest.raises(kubeconfig.KubeconfigProblem) as problem:
        await kubeconfig.load(kubeconfig=str(path), context=context, environ={})
    assert problem.value.exit == code
    assert says in str(problem.value)
