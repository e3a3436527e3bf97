"""tandem.tune and tandem.tuned share the records of `tandem tune`: a record written from Python is
the one the command reads (and the other way round), in the cache TANDEM_CACHE_DIR names. The plan
executor (no compiler) at a small size keeps it fast. Bad arguments are one tandem.Error."""
import json
import os
import subprocess

import pytest

import tandem

FUSED = "fused(RS-C-AG)+slice(m,v)"
OTHER = "RS-C-AG"
# The same search from both sides: these schedules (and the baseline), no chunk round, the plan
# executor, 2 thread ranks, N = 4096.
SEARCH = dict(sizes={"N": 4096}, ranks=2, chunks=[], executor="plan")


def tandem_command():
    exe = os.environ.get("TANDEM_COMMAND")
    if not exe or not os.access(exe, os.X_OK):
        pytest.skip("TANDEM_COMMAND does not name the tandem command (ctest sets it)")
    return exe


def command_tune(exe, schedule, cache):
    out = subprocess.run(
        [exe, "tune", "adam", "--dtype", "f32", "--size", "N=4096", "--ranks", "2", "--schedules",
         schedule, "--no-chunks", "--executor", "plan", "--reps", "1", "--warmup", "0", "--json"],
        env=dict(os.environ, TANDEM_CACHE_DIR=str(cache)), capture_output=True, text=True,
        timeout=100)
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout)


@pytest.fixture
def cache(tmp_path, monkeypatch):
    folder = tmp_path / "cache"
    monkeypatch.setenv("TANDEM_CACHE_DIR", str(folder))
    return folder


def adam():
    return tandem.workloads.adam(tandem.F32)


def test_python_and_the_command_share_records(cache):
    exe = tandem_command()
    # Python writes; the command reads the same file and times nothing.
    mine = tandem.tune(adam(), schedules=[FUSED], reps=1, warmup=0, **SEARCH)
    assert not mine.from_cache and mine.cache_file.startswith(str(cache))
    assert os.path.exists(mine.cache_file)
    assert mine.winner in ("AR-C", FUSED)  # the baseline or the schedule named
    assert [c["name"] for c in mine.record.candidates] == ["AR-C", FUSED]
    assert all(c["ok"] for c in mine.record.candidates)
    theirs = command_tune(exe, FUSED, cache)
    assert theirs["from_cache"] and theirs["cache_file"] == mine.cache_file
    assert theirs["winner"] == mine.winner
    # The command writes; Python reads it, by tune and by tuned.
    written = command_tune(exe, OTHER, cache)
    assert not written["from_cache"]
    again = tandem.tune(adam(), schedules=[OTHER], **SEARCH)
    assert again.from_cache and again.cache_file == written["cache_file"]
    assert again.winner == written["winner"]
    record = tandem.tuned(adam(), schedules=[OTHER], **SEARCH)
    assert record is not None and record.winner == written["winner"]
    assert record.ranks == 2 and record.backend == "thread" and record.sizes == {"N": 4096}


def test_tuned_is_none_without_a_record(cache):
    assert tandem.tuned(adam(), {"N": 4096}, executor="plan") is None
    assert tandem.tuned(adam(), {"N": 4096}, schedules=[FUSED], executor="plan") is None


def test_a_record_tunes_and_reads_back(cache):
    r = tandem.tune(adam(), schedules=[FUSED], reps=1, warmup=0, **SEARCH)
    got = tandem.tuned(adam(), schedules=[FUSED], **SEARCH)
    assert got is not None and got.winner == r.winner and got.chunk_bytes == r.chunk_bytes == 0
    assert json.loads(got.json())["winner"] == r.winner
    assert r.speedup("AR-C") == pytest.approx(1.0)
    with pytest.raises(tandem.Error, match="no schedule 'nope' was timed"):
        r.speedup("nope")


@pytest.mark.parametrize(
    "args, kwargs, message",
    [
        (({"N": 64},), {"ranks": 0}, "ranks must be between 1 and"),
        (({"N": 64},), {"reps": 0}, "reps must be at least 1"),
        (({"N": 64},), {"warmup": -1}, "warmup must be >= 0"),
        (({"N": 64},), {"budget": -1.0}, "budget must be >= 0"),
        (({"N": 64},), {"blocks": [0]}, "blocks: 0 is not a block count"),
        (({"N": 64},), {"chunks": [0]}, "chunks: 0 is not a chunk size"),
        (({"N": 64},), {"chunks": [1.5]}, r"chunks: 1.5 is not a size in bytes"),
        (({"N": 64},), {"executor": "fast"}, "executor"),
        (({"N": 64},), {"schedules": ["no such recipe"]}, "no such recipe"),
        (({"N": 64},), {"comm": 3}, "comm: expected a tandem.Communicator"),
        (({},), {}, "symbol 'N' is not bound"),
        (({"M": 64, "N": 64},), {}, "has no symbol 'M'"),
        (({"N": "lots"},), {}, "lots"),
        (({"N": 1.5},), {}, r"sizes\['N'\] is 1.5; give an extent"),
        ((["N", 64],), {}, "sizes must be a dict"),
    ],
)
def test_bad_arguments_are_one_error(cache, args, kwargs, message):
    with pytest.raises(tandem.Error, match=message):
        tandem.tune(adam(), *args, **kwargs)


def test_ranks_with_a_communicator_must_be_its_size(cache):
    world = tandem.mpi_world()  # one rank: this process was not started by mpirun
    with pytest.raises(tandem.Error, match="ranks=2 but comm has 1 ranks"):
        tandem.tune(adam(), {"N": 64}, ranks=2, comm=world)
    with pytest.raises(tandem.Error, match="ranks=3 but comm has 1 ranks"):
        tandem.tuned(adam(), {"N": 64}, ranks=3, comm=world)
    assert tandem.tuned(adam(), {"N": 64}, comm=world, executor="plan") is None


def test_tune_takes_a_program_not_a_schedule(cache):
    with pytest.raises(tandem.Error, match="give the tandem.Program"):
        tandem.tune(tandem.schedule(adam(), FUSED), {"N": 64})
    with pytest.raises(tandem.Error, match="expected a tandem.Program, got str"):
        tandem.tuned("adam", {"N": 64})
