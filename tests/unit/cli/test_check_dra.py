"""`colad check` in DRA mode, its pure half: what a GetInfo answer means, the verdict of the three steps,
and the slices read from the API server's list."""

from __future__ import annotations

import pytest

from colad.cli import check_dra
from colad.cli.check import EXIT_NOTHING, EXIT_OK, EXIT_WRONG
from colad.cli.check_dra import DraReport, RegistrationReport, ServiceReport, SliceRow, SlicesReport

pytestmark = pytest.mark.unit
DRIVER = "cola.myway5.com"
ENDPOINT = "/var/lib/kubelet/plugins/cola.myway5.com/dra.sock"
REG = "/var/lib/kubelet/plugins_registry/cola.myway5.com-reg.sock"


def info(**fields: object) -> RegistrationReport:
    body: dict[str, object] = {
        "type": "DRAPlugin",
        "name": DRIVER,
        "endpoint": ENDPOINT,
        "supported_versions": ["v1.DRAPlugin", "v1beta1.DRAPlugin"],
        **fields,
    }
    return RegistrationReport(socket=REG, **body)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("answer", "problem"),
    [
        (info(), None),
        (info(type="CSIPlugin"), "GetInfo type 'CSIPlugin', not 'DRAPlugin': the kubelet ignores it"),
        (info(name="other.example.com"), "GetInfo name 'other.example.com', not the configured driver"),
        (info(endpoint=""), "GetInfo names no endpoint"),
        (info(endpoint="/elsewhere.sock"), "GetInfo endpoint '/elsewhere.sock', not the configured"),
        (info(supported_versions=["v1alpha4.Node"]), "GetInfo supported_versions ['v1alpha4.Node'] name none of"),
    ],
    ids=["right", "type", "name", "no-endpoint", "endpoint", "versions"],
)
def test_a_getinfo_answer_the_kubelet_would_refuse_is_a_problem(
    answer: RegistrationReport, problem: str | None
) -> None:
    found = check_dra.info_problems(answer, DRIVER, ENDPOINT)
    if problem is None:
        assert found == []
    else:
        assert len(found) == 1 and found[0].startswith(problem), found


def test_the_kubelet_calls_the_first_service_it_knows() -> None:
    assert check_dra.chosen_service(["v9.DRAPlugin", "v1beta1.DRAPlugin", "v1.DRAPlugin"]) == "v1beta1.DRAPlugin"
    assert check_dra.chosen_service([]) is None


def test_slices_are_read_from_the_list_sorted_by_pool() -> None:
    items = [
        {"metadata": {"name": "b"}, "spec": {"pool": {"name": "n/y", "generation": 2}, "devices": [{}, {}]}},
        {"metadata": {"name": "a"}, "spec": {"pool": {"name": "n/x", "generation": 1}}},
    ]
    assert check_dra.read_slices(items) == [SliceRow("a", "n/x", 1, 0), SliceRow("b", "n/y", 2, 2)]


def report(**parts: object) -> DraReport:
    body: dict[str, object] = {
        "registration": info(),
        "service": ServiceReport(socket=ENDPOINT, service="v1.DRAPlugin", answered=True),
        "slices": SlicesReport(selector="s", listed=True, slices=[SliceRow("a", "node-1", 0, 2)]),
        **parts,
    }
    return DraReport(DRIVER, "node-1", **body)  # type: ignore[arg-type]


def test_the_verdict_names_the_first_failing_step_and_counts_the_rest() -> None:
    assert check_dra.judge_dra(report()) == (
        EXIT_OK,
        f"driver {DRIVER} answered GetInfo and NodePrepareResources; 1 slice(s) of node node-1, 2 device(s)",
    )
    refused = report(
        service=ServiceReport(socket=ENDPOINT, problems=["NodePrepareResources with no claims failed: UNAVAILABLE"]),
        slices=SlicesReport(selector="s", problems=["list failed: 403 Forbidden"]),
    )
    assert check_dra.judge_dra(refused) == (
        EXIT_WRONG,
        "service: NodePrepareResources with no claims failed: UNAVAILABLE (and 1 more)",
    )
    gone = report(
        registration=RegistrationReport(socket=REG, dead=True, problems=["no such file"]),
        service=ServiceReport(socket=ENDPOINT, dead=True, problems=["no such file"]),
    )
    assert check_dra.judge_dra(gone) == (EXIT_NOTHING, f"{REG}: no such file (is colad running?)")
    text = check_dra.render(refused, "reason")
    assert "  problem:    list failed: 403 Forbidden" in text and text.endswith("\nreason")
