"""A workload name at submit is one the model or this cluster knows (issue 28): a typo is
refused with suggestions, as `profiles` does, and a class of one's own is declared as
`custom:NAME`, which `show` says has no model. On SQLite and PostgreSQL."""

from __future__ import annotations

import pytest

from scheduler.cli.output import job_detail
from scheduler.daemon.access import Caller, RequestError, ServiceConfig
from scheduler.daemon.service import JobService
from scheduler.profile_view import UnknownWorkload, resolve

ROOT = Caller(uid=0, gid=0)


@pytest.fixture
def service(store, tmp_path):
    return JobService(store, ServiceConfig(daemon_uid=0), log_dir=tmp_path / "logs")


def submit(service, workload: str) -> int:
    return service.submit(ROOT, {"argv": ["true"], "workload": workload})["id"]


@pytest.mark.parametrize(("name", "suggestion"), [("llm-chat-7b", "llm-chat-70b"), ("nosuchclass", None),
                                                  ("finetuen", "finetune")])
def test_an_unknown_workload_is_refused_with_suggestions_and_the_custom_form(service, name, suggestion):
    with pytest.raises(RequestError) as e:
        submit(service, name)
    assert e.value.status == 400
    msg = e.value.message
    assert f"unknown workload {name!r}" in msg and f"custom:{name}" in msg and "llm-inference" in msg
    if suggestion:
        assert f"did you mean {suggestion}" in msg or suggestion in msg.split("did you mean")[1].split("?")[0]
    assert service.list_jobs(ROOT, include_done=True) == []


@pytest.mark.parametrize("name", ["llm-inference", "finetune", "train", "eval", "llm:70b", "custom:my-rag"])
def test_presets_model_specs_and_declared_own_classes_are_taken(service, name):
    assert service.get_job(ROOT, submit(service, name))["workload"] == name


def test_a_class_learned_on_this_cluster_is_known(service, store):
    from datetime import datetime, timezone

    from scheduler.profiles import CompletedRun, fold_run

    store.transact(lambda conn: fold_run(conn, CompletedRun(
        job_id=0, workload="site-eval", model="H100", gpus=1, runtime_s=100.0, energy_j=5e4, prompts=10),
        datetime.now(timezone.utc)))
    service.submissions.known_workloads._learned = None  # the cache of learned names is a few seconds old at most
    assert service.get_job(ROOT, submit(service, "site-eval"))["workload"] == "site-eval"


def test_show_says_a_custom_class_has_no_latency_model_instead_of_promising_defaults(service):
    job = service.get_job(ROOT, submit(service, "custom:my-rag"))
    text = job_detail(job)
    assert "the workload's defaults" not in text and "no latency model" in text
    preset = job_detail(service.get_job(ROOT, submit(service, "llm-chat-8b")))
    assert "the workload's defaults" in preset


def test_profiles_takes_a_model_by_size_as_submit_does():
    w = resolve("llm:70b", None)
    assert w is not None and w.total_params_b == pytest.approx(70)
    with pytest.raises(UnknownWorkload):
        resolve("llm:70b,fp3", None)
