"""hostcheck.bench.advice: only what the measurements support, never a hurting tuning, never a value the
gpunode_tuning role would reject (checked against its argument spec)."""

from __future__ import annotations

import os
from dataclasses import replace

import pytest

from hostcheck.bench import advice as A
from hostcheck.bench.plan import JEMALLOC_DECAY_CONF, JEMALLOC_GUIDE_CONF
from hostcheck.bench.run import ERROR, FINDING, MEASURED, Comparison, Side
from hostcheck.bench.stats import summarize

yaml = pytest.importorskip("yaml")
SPEC = os.path.join(
    os.path.dirname(__file__), "..", "..", "roles", "gpunode_tuning", "meta", "argument_specs.yml"
)
HURT = [0.73, 0.70, 0.75, 0.72, 0.74]
FLAT = [0.97, 1.01, 0.99, 1.00, 0.98]
GAIN = [1.10, 1.08, 1.12, 1.07, 1.09]


def comp(tuning, workload, b_key, ratios, status=MEASURED, message="", a_error=None, b_label=None):
    a = [100.0] * len(ratios)
    b = [100.0 * r for r in ratios]
    return Comparison(
        group=f"{tuning}/{workload}",
        tuning=tuning,
        workload=workload,
        title=workload,
        a=Side("base", "baseline", {}, {}, tuple(a), a_error),
        b=Side(b_key, b_label or b_key, {}, {}, tuple(b)),
        unit="img/s",
        status=status,
        summary=summarize(a, b),
        message=message,
        orders=("AB",) * len(ratios),
    )


def role(adv):
    return {i.name: i.value for i in adv.role}


def script(adv):
    return {i.name: i.value for i in adv.script}


def test_allocator_none_when_everything_hurts_or_does_nothing():
    comps = [
        comp("allocator", w, k, r)
        for w in ("pipeline", "train")
        for k, r in (
            ("jemalloc", HURT),
            ("jemalloc-guide", HURT),
            ("jemalloc-decay", FLAT),
            ("tcmalloc_minimal", FLAT),
        )
    ]
    adv = A.advise(comps)
    assert role(adv) == {"gpunode_tuning_allocator": "none"}
    reason = adv.role[0].reason
    assert "jemalloc: 0.73x pipeline (hurts), 0.73x train (hurts)" in reason and "no clear effect" in reason


def test_allocator_chosen_only_when_it_helps_and_hurts_nothing_measured():
    comps = [
        comp("allocator", "pipeline", "tcmalloc_minimal", FLAT),
        comp("allocator", "train", "tcmalloc_minimal", GAIN),
        # decay helps training more but hurts the pipeline: never advised.
        comp("allocator", "pipeline", "jemalloc-decay", HURT),
        comp("allocator", "train", "jemalloc-decay", [1.3] * 5),
    ]
    adv = A.advise(comps)
    assert role(adv) == {"gpunode_tuning_allocator": "tcmalloc"}
    assert "hurting nothing measured" in adv.role[0].reason


def test_jemalloc_comes_with_its_best_conf():
    comps = [
        comp("allocator", "pipeline", "jemalloc-guide", GAIN),
        comp("allocator", "train", "jemalloc-guide", GAIN),
        comp("allocator", "pipeline", "jemalloc-decay", [1.2] * 5),
        comp("allocator", "train", "jemalloc-decay", [1.2] * 5),
    ]
    assert role(A.advise(comps)) == {
        "gpunode_tuning_allocator": "jemalloc",
        "gpunode_tuning_jemalloc_conf": JEMALLOC_DECAY_CONF,
    }
    only_guide = role(A.advise(comps[:2]))
    assert only_guide["gpunode_tuning_jemalloc_conf"] == JEMALLOC_GUIDE_CONF


def test_an_allocator_measured_on_only_one_of_the_workloads_is_not_advised():
    comps = [
        comp("allocator", "pipeline", "tcmalloc_minimal", GAIN),
        comp("allocator", "train", "jemalloc", HURT),
    ]
    assert role(A.advise(comps)) == {"gpunode_tuning_allocator": "none"}


def test_too_few_pairs_gives_notes_not_variables():
    comps = [
        comp("allocator", "train", "tcmalloc_minimal", [1.5, 1.5]),
        comp("pillow", "pipeline", "pillow-simd", [1.4]),
    ]
    adv = A.advise(comps)
    assert adv.role == ()
    assert any("too few pairs" in n for n in adv.notes)


def test_pillow_simd():
    helps = [comp("pillow", "pipeline", "pillow-simd", [1.36, 1.3, 1.4, 1.33, 1.38])]
    assert role(A.advise(helps)) == {"gpunode_tuning_pillow_simd_enabled": True}
    hurts = [*helps, comp("pillow", "pipeline", "pillow-simd", HURT)]
    assert role(A.advise(hurts)) == {"gpunode_tuning_pillow_simd_enabled": False}
    flat = A.advise([comp("pillow", "pipeline", "pillow-simd", FLAT)])
    assert role(flat) == {} and "nothing to change" in flat.notes[0]


def test_threads_automatic_value_and_warning_against_one_thread():
    comps = [
        comp("threads", "train", "omp-1", [0.56, 0.55, 0.6, 0.57, 0.54], b_label="OMP_NUM_THREADS=1"),
        comp("threads", "train", "omp-2", FLAT, b_label="OMP_NUM_THREADS=2"),
    ]
    adv = A.advise(comps, auto_threads=2)
    assert role(adv) == {"gpunode_tuning_omp_num_threads": 0}
    assert any(n.startswith("do not set OMP_NUM_THREADS=1 here") for n in adv.notes)
    better = A.advise([*comps, comp("threads", "train", "omp-4", GAIN)], auto_threads=2)
    assert role(better) == {"gpunode_tuning_omp_num_threads": 4}
    auto_hurts = A.advise([comp("threads", "train", "omp-2", HURT)], auto_threads=2)
    assert role(auto_hurts) == {"gpunode_tuning_threading_enabled": False}


def test_shm_finding_and_measured_gain():
    finding = comp(
        "shm",
        "pipeline",
        "shm-large",
        [],
        status=FINDING,
        message="a 64M /dev/shm breaks DataLoader workers: crashed (killed by signal SIGBUS)",
        a_error="crashed",
    )
    adv = A.advise([finding], shm_large="50%")
    assert role(adv) == {"gpunode_tuning_shm_size": "50%"}
    assert adv.role[0].reason == "a 64M /dev/shm breaks DataLoader workers: crashed (killed by signal SIGBUS)"
    long = replace(finding, message="a 64M /dev/shm breaks: Caught X ... RuntimeError: No space")
    assert A.advise([long]).role[0].reason == "a 64M /dev/shm breaks: RuntimeError: No space"
    assert role(A.advise([comp("shm", "pipeline", "shm-large", FLAT)])) == {}
    assert role(A.advise([comp("shm", "pipeline", "shm-large", GAIN)], shm_large="16G")) == {
        "gpunode_tuning_shm_size": "16G"
    }


def test_dataloader_advice_takes_the_fewest_workers_near_the_best():
    comps = [
        comp("workers", "pipeline", "w1", [0.82] * 5),
        comp("workers", "pipeline", "w2", [1.56, 1.55, 1.6, 1.5, 1.58]),
        comp("workers", "pipeline", "w3", [1.57, 1.54, 1.59, 1.52, 1.58]),
        comp("workers", "e2e", "w2", [0.94, 0.93, 0.92, 0.95, 0.9]),
        comp("persistent_workers", "pipeline", "persistent", GAIN),
        comp("pin_memory", "pipeline", "pinned", FLAT),
    ]
    adv = A.advise(comps)
    assert script(adv) == {"num_workers": 2, "persistent_workers": True}
    assert any("compete with the model" in n for n in adv.notes)
    assert any(n.startswith("pin_memory:") for n in adv.notes)
    none_help = A.advise([comp("workers", "pipeline", "w1", [0.82] * 5)])
    assert script(none_help) == {"num_workers": 0}


def test_noisy_comparisons_are_shown_but_not_advised_on():
    busy = comp("allocator", "train", "tcmalloc_minimal", [1.19, 1.89, 2.99, 1.5, 1.3])
    assert busy.summary.noisy and busy.verdict == "helps"
    adv = A.advise([busy, comp("allocator", "train", "jemalloc", [0.42, 0.98, 0.6, 0.7, 0.65])])
    assert adv.role == ()
    assert adv.notes[-1].startswith("not used for advice, the pairs spread too wide")


def test_errors_advise_nothing():
    c = comp("allocator", "train", "jemalloc", HURT, status=ERROR, message="LD_PRELOAD path did not load")
    assert A.advise([c]) == A.Advice()


def test_invalid_values_are_never_printed():
    assert A.role_value_error("gpunode_tuning_allocator", "mimalloc")
    assert A.role_value_error("gpunode_tuning_shm_size", "64MB")
    assert A.role_value_error("gpunode_tuning_shm_size", "150%")
    assert A.role_value_error("gpunode_tuning_omp_num_threads", -1)
    assert A.role_value_error("gpunode_tuning_omp_num_threads", True)
    assert A.role_value_error("gpunode_tuning_jemalloc_conf", "a b")
    assert A.role_value_error("gpunode_tuning_pillow_simd_enabled", "yes")
    assert A.role_value_error("gpunode_tuning_nonsense", 1)
    assert A.role_value_error("gpunode_tuning_jemalloc_conf", JEMALLOC_GUIDE_CONF) is None
    adv = A.advise([comp("shm", "pipeline", "shm-large", GAIN)], shm_large="lots")
    assert adv.role == () and adv.notes[0].startswith("not advised: gpunode_tuning_shm_size")


def test_role_vars_match_the_argument_spec():
    with open(SPEC) as f:
        options = yaml.safe_load(f)["argument_specs"]["main"]["options"]
    for name, spec in A.ROLE_VARS.items():
        assert name in options, name
        assert options[name]["type"] == spec["type"], name
        assert tuple(options[name].get("choices", ())) == tuple(spec.get("choices", ())), name


def test_rendered_advice_is_valid_inventory_yaml():
    comps = [
        comp("allocator", "pipeline", "jemalloc-guide", GAIN),
        comp("allocator", "train", "jemalloc-guide", GAIN),
        comp("pillow", "pipeline", "pillow-simd", [1.36] * 5),
        comp("threads", "train", "omp-2", FLAT),
        comp("shm", "pipeline", "shm-large", [], status=FINDING, message="breaks", a_error="x"),
        comp("workers", "pipeline", "w2", [1.56] * 5),
    ]
    text = A.render_advice(A.advise(comps, auto_threads=2), "advice for test-node")
    data = yaml.safe_load(text)
    assert data == {
        "gpunode_tuning_allocator": "jemalloc",
        "gpunode_tuning_jemalloc_conf": JEMALLOC_GUIDE_CONF,
        "gpunode_tuning_pillow_simd_enabled": True,
        "gpunode_tuning_omp_num_threads": 0,
        "gpunode_tuning_shm_size": "50%",
    }
    with open(SPEC) as f:
        options = yaml.safe_load(f)["argument_specs"]["main"]["options"]
    for k, v in data.items():
        assert k in options
        assert v in options[k].get("choices", [v])
    assert "#   DataLoader(..., num_workers=2)" in text
    assert text.startswith("---\n# advice for test-node\n")
    assert A.render_advice(A.Advice()).startswith("---\n# No gpunode_tuning variable")


def test_rendered_advice_passes_the_repos_yamllint():
    # An admin drops it into group_vars/; the repo's own lint must accept it, long reasons included.
    from yamllint import linter
    from yamllint.config import YamlLintConfig

    long_reason = [1.36, 1.3, 1.4, 1.33, 1.38]
    comps = [
        comp("pillow", "pipeline", "pillow-simd", long_reason),
        comp("allocator", "pipeline", "jemalloc-guide", HURT),
        comp("allocator", "train", "jemalloc-guide", HURT),
        comp("threads", "train", "omp-1", HURT),
        comp("workers", "pipeline", "w2", [1.56] * 5),
    ]
    header = "hostcheck bench advice for a-node-with-a-long-name (2026-11-23T07:00:25Z): " + "x" * 150
    text = A.render_advice(A.advise(comps, auto_threads=2), header)
    conf = YamlLintConfig(file=os.path.join(os.path.dirname(SPEC), "..", "..", "..", ".yamllint"))
    problems = [f"{p.line}: {p.desc}" for p in linter.run(text, conf)]
    assert problems == []
    assert max(len(line) for line in text.splitlines()) <= 120
