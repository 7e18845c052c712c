"""Properties over hostile input: whatever a fact file, an environment file or an option holds, hostcheck ends
with exit 0, 1 or 2, no traceback, and a finding that names the input it could not use."""

from __future__ import annotations

import contextlib
import io
import json
import string
import tempfile
from pathlib import Path
from unittest import mock

import hostcheck_scenarios as S
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from hostcheck import command
from hostcheck.checks import all_checks
from hostcheck.core import evaluate
from hostcheck.gather.facts import ROLES, SCHEMA, gather_facts
from hostcheck.gather.tuning import env_file_entries
from hostcheck.registry import Status

SETTINGS = settings(
    max_examples=60, deadline=None, database=None, suppress_health_check=[HealthCheck.too_slow]
)
JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=20),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=10), inner, max_size=4),
    max_leaves=10,
)
KNOWN = sorted({(role, key) for role, keys in SCHEMA.items() for key in keys})


@SETTINGS
@given(
    role=st.sampled_from(ROLES),
    fact=st.dictionaries(
        st.sampled_from(sorted({k for keys in SCHEMA.values() for k in keys})) | st.text(), JSON
    ),
)
def test_any_fact_file_is_read_or_named_and_every_check_still_judges(role, fact):
    with tempfile.TemporaryDirectory() as d:
        (Path(d) / f"{role}.fact").write_text(json.dumps(fact))
        facts = gather_facts(d)
    kept = facts.roles.get(role, {})
    for key in SCHEMA.get(role, {}):
        if key in fact and key not in kept:
            assert any(f"{role}.fact: {key} is " in bad for bad in facts.invalid)
    roles = S.h100_facts()
    roles[role] = kept
    results, _ = evaluate(S.make_snapshot(facts=roles), [c for c in all_checks() if not c.workload])
    assert all(r.status in Status for r in results)
    # An error result is a check that raised: never for a value the facts reader let through.
    assert not [r for r in results if r.status == Status.ERROR], [
        r.message for r in results if r.status == "error"
    ]


@SETTINGS
@given(role_key=st.sampled_from(KNOWN), value=JSON)
def test_a_wrong_value_for_a_known_key_is_dropped_or_usable(role_key, value):
    role, key = role_key
    with tempfile.TemporaryDirectory() as d:
        (Path(d) / f"{role}.fact").write_text(json.dumps({key: value}))
        facts = gather_facts(d)
    if facts.has(role, key):
        assert SCHEMA[role][key](facts.get(role, key)) is None
    else:
        assert facts.invalid and key in facts.invalid[0]


@SETTINGS
@given(
    text=st.text(
        alphabet=st.characters(blacklist_categories=("Cs",)) | st.sampled_from("\0=\n#'\" "), max_size=300
    )
)
def test_env_file_entries_are_always_usable_in_a_child_environment(text):
    env, problems = env_file_entries(text)
    for k, v in env.items():
        assert (
            k
            and k[0] in string.ascii_letters + "_"
            and all(c in string.ascii_letters + string.digits + "_" for c in k)
        )
        assert "\0" not in v
    assert all(p.startswith("line ") for p in problems)


@contextlib.contextmanager
def _fake_gather():
    snap = S.SCENARIOS["healthy_8x_h100"][0]()
    with mock.patch("hostcheck.gather.gather", lambda options, needs: snap):
        yield


NUMBERS = st.text(max_size=12) | st.sampled_from(
    ["nan", "inf", "-inf", "1e400", "-0", "0", "1e-300", "", "5"]
)
# Report paths: names inside the test's own folder (a random absolute path would be written as root).
NAMES = st.text(alphabet=st.characters(blacklist_categories=("Cs",), blacklist_characters="/\0"), max_size=12)


@SETTINGS
@given(
    option=st.tuples(
        st.sampled_from(
            [
                "--timeout",
                "--torch-timeout",
                "--workload-timeout",
                "--rdzv-timeout",
                "--burn",
                "--min-score",
                "--expect-gpus",
                "--nproc-per-node",
                "--fail-level",
                "--only",
                "--skip",
            ]
        ),
        NUMBERS,
    )
    | st.tuples(st.sampled_from(["--prometheus", "--junit"]), NAMES | st.just("/dev/full")),
)
def test_any_option_value_ends_in_0_1_or_2_without_a_traceback(option):
    flag, value = option
    err = io.StringIO()
    with (
        tempfile.TemporaryDirectory() as d,
        contextlib.chdir(d),
        _fake_gather(),
        contextlib.redirect_stderr(err),
        contextlib.redirect_stdout(io.StringIO()),
    ):
        rc = command.main(["--quick", f"{flag}={value}"])
    assert rc in (0, 1, 2), (flag, value, rc)
    assert "Traceback" not in err.getvalue() and "internal error" not in err.getvalue(), err.getvalue()


@settings(max_examples=40, deadline=None, database=None, suppress_health_check=[HealthCheck.too_slow])
@given(tuning=st.dictionaries(st.sampled_from(sorted(SCHEMA["gpunode_tuning"])), JSON, min_size=1))
def test_a_real_run_over_any_tuning_fact_exits_cleanly_and_names_what_it_dropped(tuning):
    """The gatherers themselves read these (services_disabled, env_file): a wrong type once ended the run."""
    out, err = io.StringIO(), io.StringIO()
    with tempfile.TemporaryDirectory() as d, contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        (Path(d) / "gpunode_tuning.fact").write_text(json.dumps(tuning))
        rc = command.main(["--json", "--only", "system.E004,tuning.E006,tuning.E011", "--facts-dir", d])
    assert rc in (0, 1), err.getvalue()
    doc = json.loads(out.getvalue())
    e004 = next(c for c in doc["checks"] if c["id"] == "system.E004")
    for key, value in tuning.items():
        if SCHEMA["gpunode_tuning"][key](value):
            assert f"gpunode_tuning.fact: {key} is " in e004["message"], (key, value, e004["message"])
