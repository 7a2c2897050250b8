"""Trace import: the artifact layout, the PAI layout, bad input by line, the 10x rule."""

from __future__ import annotations

import pytest

from controlplane.events import Plan
from replay.importers import pai_model, read_trace
from replay.trace import TraceError, decode_plan, scale_trace

from .conftest import ARTIFACT

HEADER = "name,submission_time,duration,application,num_gpus,num_cpus,bandwidth,exec_plan,steps,is_sla"


@pytest.mark.parametrize("code,gpus,plan", [
    ("151", 5, Plan(pp=1, tp=5, dp=1)),
    ("244", 32, Plan(pp=2, tp=4, dp=4)),
    ("641", 24, Plan(pp=6, tp=4, dp=1)),
    ("ga", 4, Plan(dp=4)),
    ("gc", 2, Plan(dp=2, gc=True)),
    ("zero-dp", 8, Plan(dp=8, zero_stage=2)),
    ("zero-offload", 8, Plan(dp=8, zero_stage=2, offload=True)),
])
def test_plan_codes_decode_as_the_artifact_defines_them(code, gpus, plan):
    assert decode_plan(code, gpus) == plan


@pytest.mark.parametrize("code,gpus", [("151", 4), ("x", 2), ("100", 0), ("", 1)])
def test_bad_plan_codes_are_refused(code, gpus):
    with pytest.raises(ValueError):
        decode_plan(code, gpus)


def test_the_three_artifact_traces_import_whole(parts):
    base = read_trace(ARTIFACT / "workload-base.csv", parts.batches)
    mt = read_trace(ARTIFACT / "workload-mt.csv", parts.batches)
    bp = read_trace(ARTIFACT / "workload-bp.csv", parts.batches)
    assert [len(t.jobs) for t in (base, mt, bp)] == [406, 406, 406]
    assert not base.skipped and not mt.skipped and not bp.skipped
    assert sum(j.guaranteed for j in mt.jobs) == 194 and not any(j.guaranteed for j in base.jobs)
    assert sum(a.plan != b.plan for a, b in zip(base.jobs, bp.jobs)) == 276
    first = base.jobs[0]
    sub = first.submission(parts.batches[first.model])
    assert (sub.job_id, sub.model.type, sub.resources.gpus, sub.target_iterations) == ("vit-0", "vit", 2, 37239)
    assert sub.global_batch_size == parts.models["vit"].spec.global_batch_size and sub.tenant == "default"


BAD_ROWS = [
    "ok-0,0,10,vit,2,16,0,zero-dp,100,0",
    "unknown-1,5,10,resnet,2,16,0,zero-dp,100,0",      # line 3: unknown model
    "zero-2,6,10,bert,0,0,0,ga,100,0",                 # line 4: zero GPUs
    "neg-3,7,10,bert,-2,16,0,ga,100,0",                # line 5: negative GPUs
    "short-4,8,10,bert,2",                             # line 6: missing columns
    "ok-5,9,10,bert,2,16,0,ga,100,0",
    "back-6,3,10,bert,2,16,0,ga,100,0",                # line 8: time goes backwards
    "plan-7,10,10,gpt2,4,32,0,151,100,0",              # line 9: plan uses 5 GPUs
    "empty-8,,10,bert,2,16,0,ga,100,0",                # line 10: missing value
    "ok-9,11,10,t5,4,32,0,zero-dp,5,1",
]


def test_bad_lines_are_reported_by_number_and_refuse_the_file(tmp_path, parts):
    path = tmp_path / "bad.csv"
    path.write_text("\n".join([HEADER, *BAD_ROWS]) + "\n")
    with pytest.raises(TraceError) as info:
        read_trace(path, parts.batches)
    lines = {p.line: p.reason for p in info.value.problems}
    assert sorted(lines) == [3, 4, 5, 6, 8, 9, 10]
    assert "unknown model 'resnet'" in lines[3]
    assert "zero or negative GPUs" in lines[4] and "zero or negative GPUs" in lines[5]
    assert "missing columns" in lines[6] and "goes backwards" in lines[8]
    assert "5 GPUs" in lines[9] and "missing value" in lines[10]
    assert "line 3:" in str(info.value)


def test_bad_lines_can_be_skipped_and_counted(tmp_path, parts):
    path = tmp_path / "bad.csv"
    path.write_text("\n".join([HEADER, *BAD_ROWS]) + "\n")
    trace = read_trace(path, parts.batches, on_bad="skip")
    assert [j.name for j in trace.jobs] == ["ok-0", "ok-5", "ok-9"]
    assert len(trace.skipped) == 7 and trace.jobs[-1].guaranteed


def test_a_missing_column_refuses_the_file_even_when_skipping(tmp_path, parts):
    path = tmp_path / "nocol.csv"
    path.write_text("name,submission_time,application,num_gpus,exec_plan\nvit-0,0,vit,2,zero-dp\n")
    with pytest.raises(TraceError, match="missing column.*steps"):
        read_trace(path, parts.batches, on_bad="skip")


def test_bytes_that_are_not_text_are_a_bad_line_not_a_crash(tmp_path, parts):
    """A line with bytes that are not UTF-8, or a field the csv module will not read, is reported by
    its number like any bad line (and can be skipped); the lines around it are still read."""
    path = tmp_path / "mixed.csv"
    huge = "x" * 200_000
    path.write_bytes("\n".join([HEADER, "ok-0,0,100,vit,2,16,0,zero-dp,100,0",
                                 "caf\xe9-1,5,100,vit,2,16,0,zero-dp,100,0".encode("latin-1").decode("utf-8", "surrogateescape"),
                                 f"{huge},6,100,vit,2,16,0,zero-dp,100,0",
                                 "ok-3,7,100,vit,2,16,0,zero-dp,100,1"]).encode("utf-8", "surrogateescape") + b"\n")
    with pytest.raises(TraceError) as info:
        read_trace(path, parts.batches)
    lines = {p.line: p.reason for p in info.value.problems}
    assert lines.keys() == {3, 4} and "not UTF-8" in lines[3] and "field" in lines[4]
    assert info.value.skippable
    trace = read_trace(path, parts.batches, on_bad="skip")
    assert [j.name for j in trace.jobs] == ["ok-0", "ok-3"] and len(trace.skipped) == 2


@pytest.mark.parametrize("content", [b"\x7fELF\x02\x01\x01\x00\xd0\xff,\x00\n\x93\x12", b""])
def test_a_file_that_is_not_a_trace_is_refused_whole(tmp_path, parts, content):
    path = tmp_path / "binary.csv"
    path.write_bytes(content)
    for layout in ("auto", "artifact", "pai"):
        with pytest.raises(TraceError) as info:
            read_trace(path, parts.batches, layout=layout, on_bad="skip")
        assert not info.value.skippable and "bad line" not in str(info.value)
        assert ("not UTF-8" if content else "empty file") in str(info.value)


def test_a_path_that_is_no_file_is_named_for_what_it_is(tmp_path, parts):
    for path, why in ((tmp_path / "nowhere.csv", "no such file"), (tmp_path, "a folder, not a trace file")):
        with pytest.raises(TraceError) as info:
            read_trace(path, parts.batches)
        assert not info.value.skippable and why in str(info.value) and str(path) in str(info.value)


def test_ten_times_trace_rule(parts):
    base = read_trace(ARTIFACT / "workload-base.csv", parts.batches).jobs
    big = scale_trace(base, 10)
    assert len(big) == 4060 and len({j.name for j in big}) == 4060
    assert all(a.submit_s <= b.submit_s for a, b in zip(big, big[1:]))
    copies = [j for j in big if j.name.startswith("llama30-1.")]
    assert [j.submit_s - 1639 for j in copies] == list(range(10))
    assert scale_trace(base, 10) == big


PAI_ROWS = [
    "j1,worker,1,Terminated,100,1300,600,29.3,100,V100",
    "j1,ps,1,Terminated,100,1300,200,10,,",
    "j2,worker,2,Terminated,50,650,600,29.3,50,T4",
    "j3,worker,1,Failed,60,90,600,29.3,100,P100",
    "j4,worker,3,Terminated,200,2000,600,29.3,100,V100",
    "j5,worker,1,Terminated,300,200,600,29.3,100,V100",
    "j6,worker,1,Terminated,400,500,600,29.3,-100,V100",
]


def test_pai_task_table_without_header(tmp_path, parts):
    path = tmp_path / "pai_task_table.csv"
    path.write_text("\n".join(PAI_ROWS) + "\n")
    with pytest.raises(TraceError) as info:
        read_trace(path, parts.batches)
    assert {p.line for p in info.value.problems} == {6, 7}
    trace = read_trace(path, parts.batches, on_bad="skip",
                       iter_time=lambda m, plan, g: parts.table.iter_time(m, plan, (g,)))
    assert trace.layout == "pai"
    jobs = {j.name: j for j in trace.jobs}
    assert sorted(jobs) == ["j1", "j2", "j4"] and len(trace.filtered) == 2
    assert (jobs["j1"].gpus, jobs["j2"].gpus, jobs["j4"].gpus) == (1, 1, 4)
    assert jobs["j2"].submit_s == 0 and jobs["j1"].submit_s == 50
    assert jobs["j4"].model == pai_model("j4") and jobs["j4"].plan == Plan(dp=4, zero_stage=2)
    t = parts.table.iter_time(jobs["j4"].model, jobs["j4"].plan, (4,))
    assert jobs["j4"].steps == round(1800 / t)


def test_pai_with_header_and_users(tmp_path, parts):
    path = tmp_path / "pai.csv"
    path.write_text("job_name,task_name,inst_num,status,start_time,end_time,plan_cpu,plan_mem,plan_gpu,gpu_type,user\n"
                    "a,worker,8,Terminated,0,3600,600,29,100,V100,u@1\nb,worker,1,Terminated,10,70,600,29,25,T4,\n")
    trace = read_trace(path, parts.batches)
    assert [(j.name, j.gpus, j.tenant) for j in trace.jobs] == [("a", 8, "u-1"), ("b", 1, "default")]
