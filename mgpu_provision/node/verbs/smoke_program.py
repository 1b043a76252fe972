"""The DDP smoke program: what every rank runs under torchrun on the nodes.

It exists to prove, with a real job, that a fleet can train together: every rank joins, collectives give
exact results, one DDP step leaves identical parameters everywhere, and how fast all_reduce is. Each rank
writes one JSON file (`rank-<RANK>.json` in the config's `out_dir`) that the node side (`node/verbs/smoke.py`)
collects. Checks that fail are recorded and the rank still exits 0, so that no
rank is torn down before it has written its result; only an exception (a broken collective) exits non-zero.
Once the result is written the rank leaves at once (`leave`), without the interpreter's teardown.

Stdlib imports only at module level (torch is imported inside functions) and Python 3.8 syntax, because the
module ships inside the agent zipapp and is copied to a temporary file on the node.

The DataParallel check (all of a node's GPUs in one process) runs apart, as a single process started by
the node side after torchrun and every rank have ended (`--data-parallel`): a rank doing it would need
contexts on the GPUs the other ranks hold, which EXCLUSIVE_PROCESS compute mode refuses and which otherwise
competes with them for memory. It writes `data-parallel.json`.

Usage (torchrun sets RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE, GROUP_RANK):
    python -m torch.distributed.run ... program.py CONFIG.json
    python program.py --data-parallel CONFIG.json
CONFIG keys: out_dir, expected_world_size, backend ("nccl"|"gloo"), batch_size, sizes_mib, iters,
warmup_iters, pg_timeout_s.
"""

from __future__ import annotations

import contextlib
import datetime
import hashlib
import json
import os
import socket
import struct
import sys
import time
import traceback

# typing_lite's flag, here: this file runs as a script of its own, outside the package.
TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any, Dict, List, Optional

    Json = Dict[str, Any]

WARMUP_ITERS = 1  # when the config names none
# An in-place all_reduce of N bytes needs N on the GPU plus NCCL's buffers and the allocator's rounding:
# sizes above this share of the smallest free memory of any rank are skipped (on every rank alike).
FREE_MEMORY_SHARE = 0.4


def bus_bandwidth(algbw_gbps: float, world_size: int) -> float:
    """nccl-tests' busbw for all_reduce (doc/PERFORMANCE.md): algbw x 2(n-1)/n, where algbw is the
    buffer's size over the time of one all_reduce; it is comparable across world sizes and, at large
    sizes, to the hardware's bus bandwidth."""
    return algbw_gbps * 2.0 * (world_size - 1) / world_size


def sizes_that_fit(sizes_mib: List[float], free_bytes: Optional[int]) -> List[float]:
    """The sizes whose tensor fits in FREE_MEMORY_SHARE of `free_bytes` (None: the CPU, all of them)."""
    if free_bytes is None:
        return list(sizes_mib)
    return [s for s in sizes_mib if float(s) * 1024 * 1024 <= free_bytes * FREE_MEMORY_SHARE]


def device_of(backend: str, cuda_available: bool, local_rank: int) -> str:
    """The rank's device: its GPU under NCCL, the CPU under Gloo. NCCL without CUDA is an error, never a
    quiet run on the CPU: the node side checks CUDA first, so this only fires when a rank disagrees."""
    if backend != "nccl":
        return "cpu"
    if not cuda_available:
        raise RuntimeError("backend nccl needs CUDA, and torch.cuda.is_available() is False in this rank")
    return "cuda:%d" % local_rank


def allreduce_pattern(rank: int, n: int) -> List[float]:
    """Rank r contributes (r+1) x (i % 7 + 1): small integers, so float32 sums are exact."""
    return [float((rank + 1) * (i % 7 + 1)) for i in range(n)]


def expected_allreduce(world_size: int, n: int) -> List[float]:
    total = world_size * (world_size + 1) // 2
    return [float(total * (i % 7 + 1)) for i in range(n)]


def checksum(values: List[float]) -> int:
    """A signed 64-bit digest of float64 values, small enough to all_gather as one int64."""
    digest = hashlib.sha256(struct.pack("<%dd" % len(values), *values)).digest()
    return int.from_bytes(digest[:8], "little", signed=True)


class Rank:
    """One rank's run: the process group, its device, and the result it reports."""

    def __init__(self, config: Json) -> None:
        import torch

        self.config = config
        self.rank = int(os.environ["RANK"])
        self.world_size = int(os.environ["WORLD_SIZE"])
        self.local_rank = int(os.environ.get("LOCAL_RANK", "0"))
        self.backend = str(config["backend"])
        self.device = torch.device(device_of(self.backend, torch.cuda.is_available(), self.local_rank))
        self.cuda = self.backend == "nccl"
        gpu = None
        if self.cuda:
            torch.cuda.set_device(self.local_rank)
            properties = torch.cuda.get_device_properties(self.local_rank)
            gpu = {
                "index": self.local_rank,  # CUDA's numbering, after CUDA_VISIBLE_DEVICES
                "name": properties.name,
                "uuid": str(getattr(properties, "uuid", "")) or None,
                "visible_devices": os.environ.get("CUDA_VISIBLE_DEVICES"),
            }
        self.result: Json = {
            "rank": self.rank,
            "local_rank": self.local_rank,
            "node_rank": int(os.environ.get("GROUP_RANK", "0")),
            "local_world_size": int(os.environ.get("LOCAL_WORLD_SIZE", "1")),
            "world_size": self.world_size,
            "expected_world_size": int(config["expected_world_size"]),
            "hostname": socket.gethostname(),
            "pid": os.getpid(),
            "torch": str(torch.__version__),
            "requested_backend": config.get("requested_backend", self.backend),
            "simulated": bool(config.get("simulated")),
            "backend": self.backend,
            "device": str(self.device),
            "gpu": gpu,
            "cuda_devices": torch.cuda.device_count() if self.cuda else 0,
            "checks": [],
            "bandwidth": [],
            "ok": False,
            "error": None,
        }

    def check(self, name: str, ok: bool, detail: str) -> None:
        self.result["checks"].append({"name": name, "ok": bool(ok), "detail": detail})

    def run(self) -> None:
        import torch.distributed as dist

        started = time.monotonic()
        dist.init_process_group(
            backend=self.backend,
            timeout=datetime.timedelta(seconds=float(self.config["pg_timeout_s"])),
        )
        try:
            self.check_world_size()
            self.check_allreduce()
            self.check_ddp_step()
            self.measure_bandwidth()
            dist.barrier()  # every collective of every rank is done: nothing is in flight after this
        finally:
            dist.destroy_process_group()
        self.result["elapsed_s"] = round(time.monotonic() - started, 3)
        self.result["ok"] = all(c["ok"] for c in self.result["checks"])

    def check_world_size(self) -> None:
        import torch.distributed as dist

        expected = int(self.config["expected_world_size"])
        actual = dist.get_world_size()
        self.check("world_size", actual == expected, "%d ranks joined, expected %d" % (actual, expected))

    def check_allreduce(self) -> None:
        import torch
        import torch.distributed as dist

        n = 1024
        tensor = torch.tensor(allreduce_pattern(self.rank, n), dtype=torch.float32, device=self.device)
        dist.all_reduce(tensor)
        got = tensor.cpu().tolist()
        want = expected_allreduce(self.world_size, n)
        wrong = [i for i in range(n) if got[i] != want[i]]
        detail = (
            "sum of %d ranks exact over %d elements" % (self.world_size, n)
            if not wrong
            else "element %d is %r, expected %r (%d wrong)"
            % (wrong[0], got[wrong[0]], want[wrong[0]], len(wrong))
        )
        self.check("all_reduce", not wrong, detail)

    def check_ddp_step(self) -> None:
        import torch
        from torch.nn.parallel import DistributedDataParallel
        from torch.utils.data import DataLoader, TensorDataset
        from torch.utils.data.distributed import DistributedSampler

        batch = int(self.config["batch_size"])
        torch.manual_seed(1234 + self.rank)  # differing inits: DDP must broadcast rank 0's parameters
        model = _small_model().to(self.device)
        ddp = DistributedDataParallel(model, device_ids=[self.local_rank] if self.backend == "nccl" else None)
        before = _flat_parameters(model)

        generator = torch.Generator().manual_seed(0)
        samples = batch * self.world_size
        dataset = TensorDataset(
            torch.randn(samples, 8, generator=generator), torch.randn(samples, 1, generator=generator)
        )
        sampler: Any = DistributedSampler(
            dataset, num_replicas=self.world_size, rank=self.rank, shuffle=True, seed=0
        )
        sampler.set_epoch(0)
        shard = list(sampler)
        inputs, targets = next(iter(DataLoader(dataset, batch_size=batch, sampler=sampler)))

        optimizer = torch.optim.SGD(ddp.parameters(), lr=0.1)
        loss = torch.nn.functional.mse_loss(ddp(inputs.to(self.device)), targets.to(self.device))
        loss.backward()  # type: ignore[no-untyped-call]
        optimizer.step()
        after = _flat_parameters(model)

        shards = self._gather_lists(shard, len(shard))
        covered = sorted(i for s in shards for i in s)
        self.check(
            "sampler_shards",
            covered == list(range(samples)),
            "%d ranks x %d samples cover the dataset once" % (self.world_size, len(shard))
            if covered == list(range(samples))
            else "shards overlap or miss samples: %r" % shards,
        )
        sums = self._gather_lists([checksum(after)], 1)
        own = checksum(after)
        same = all(s[0] == own for s in sums)
        self.result["param_checksum"] = "%016x" % (own & 0xFFFFFFFFFFFFFFFF)
        self.check(
            "ddp_step",
            same and after != before,
            "identical parameters on %d ranks after one step (loss %.4f)" % (self.world_size, loss.item())
            if same and after != before
            else ("the step changed no parameter" if same else "parameter checksums differ: %r" % sums),
        )

    def measure_bandwidth(self) -> None:
        import torch
        import torch.distributed as dist

        iters = int(self.config["iters"])
        warmup = int(self.config.get("warmup_iters") or WARMUP_ITERS)
        free = None
        if self.cuda:  # every rank must skip the same sizes, or the collectives would not pair up
            least = torch.tensor([torch.cuda.mem_get_info()[0]], dtype=torch.int64, device=self.device)
            dist.all_reduce(least, op=dist.ReduceOp.MIN)
            free = int(least.item())
        sizes = sizes_that_fit(self.config["sizes_mib"], free)
        self.result["sizes_skipped_mib"] = [float(s) for s in self.config["sizes_mib"] if s not in sizes]
        for size_mib in sizes:
            nbytes = int(float(size_mib) * 1024 * 1024) // 4 * 4
            tensor = torch.ones(nbytes // 4, dtype=torch.float32, device=self.device)
            for _ in range(warmup):
                dist.all_reduce(tensor)
            self._sync()
            dist.barrier()
            delay = drill_delay_s(os.environ.get(SLOW_HOST_ENV), self.result["hostname"])
            start = time.perf_counter()
            for _ in range(iters):
                if delay:
                    time.sleep(delay)
                dist.all_reduce(tensor)
            self._sync()
            elapsed = torch.tensor(
                [(time.perf_counter() - start) / iters], dtype=torch.float64, device=self.device
            )
            # The slowest rank bounds the collective; every rank reports the same figure.
            dist.all_reduce(elapsed, op=dist.ReduceOp.MAX)
            seconds = float(elapsed.item())
            algbw = nbytes / seconds / 1e9
            self.result["bandwidth"].append(
                {
                    "size_mib": float(size_mib),
                    "bytes": nbytes,
                    "iters": iters,
                    "warmup_iters": warmup,
                    "time_us": round(seconds * 1e6, 1),
                    "algbw_gbps": round(algbw, 4),
                    "busbw_gbps": round(bus_bandwidth(algbw, self.world_size), 4),
                }
            )
            del tensor  # freed before the next, larger one is allocated

    def _sync(self) -> None:
        if self.backend == "nccl":
            import torch

            torch.cuda.synchronize()

    def _gather_lists(self, values: List[int], length: int) -> List[List[int]]:
        import torch
        import torch.distributed as dist

        mine = torch.tensor(values, dtype=torch.int64, device=self.device)
        parts = [torch.zeros(length, dtype=torch.int64, device=self.device) for _ in range(self.world_size)]
        dist.all_gather(parts, mine)
        return [[int(v) for v in p.cpu().tolist()] for p in parts]


def _small_model() -> Any:
    import torch

    return torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 1))


def _flat_parameters(model: Any) -> List[float]:
    return [float(v) for p in model.parameters() for v in p.detach().cpu().double().flatten().tolist()]


DATA_PARALLEL_FLAG = "--data-parallel"
DATA_PARALLEL_FILE = "data-parallel.json"
# The words of cudaErrorDevicesUnavailable, CUDA's answer when a GPU's compute mode refuses a context.
_DEVICES_UNAVAILABLE = "busy or unavailable"


def data_parallel_row(ok: bool, detail: str, **facts: Any) -> Json:
    """The node's data_parallel check row: a rank's check row, plus what DataParallel was given."""
    row: Json = {"name": "data_parallel", "ok": bool(ok), "detail": detail}
    row.update(facts)
    return row


def refused_context(index: int, name: str, error: str) -> str:
    """Why a GPU gave this process no context. This process is alone on the node (every rank has ended),
    so CUDA's "busy or unavailable" means PROHIBITED, or a process outside the smoke holding the GPU in
    EXCLUSIVE_PROCESS mode; torch cannot read the mode itself, nvidia-smi can."""
    if _DEVICES_UNAVAILABLE in error:
        return (
            "cuda:%d (%s) refused a CUDA context: its compute mode is PROHIBITED, or a process outside the "
            "smoke holds it in EXCLUSIVE_PROCESS mode (nvidia-smi -q -d COMPUTE,PIDS shows which)"
            % (index, name)
        )
    return "cuda:%d (%s) refused a CUDA context: %s" % (index, name, error.strip().splitlines()[0])


def check_data_parallel(config: Json) -> Json:
    """DataParallel on all visible GPUs from one process: parameters on device_ids[0], the output on
    output_device, and a batch of at least one sample per GPU. Without CUDA it refuses: never a CPU run."""
    import torch

    batch = int(config["batch_size"])
    if not torch.cuda.is_available():
        return data_parallel_row(
            False,
            "DataParallel needs CUDA, and torch %s cannot use it in this process (torch.cuda.is_available() "
            "is False)" % torch.__version__,
            batch=batch,
        )
    gpus = torch.cuda.device_count()
    device_ids = list(range(gpus))
    output_device = device_ids[-1]
    facts = {"gpus": gpus, "device_ids": device_ids, "output_device": output_device, "batch": batch}
    if batch < gpus:
        detail = "batch size %d < %d GPUs: DataParallel would silently use only %d" % (batch, gpus, batch)
        return data_parallel_row(False, detail, **facts)
    for index in device_ids:  # one context per GPU first, so that a refusal names its GPU and the reason
        try:
            torch.zeros(1, device=torch.device("cuda", index))
        except RuntimeError as exc:
            name = torch.cuda.get_device_name(index)
            return data_parallel_row(False, refused_context(index, name, str(exc)), **facts)
    module = _small_model().to(torch.device("cuda", device_ids[0]))  # parameters must be on device_ids[0]
    parallel = torch.nn.DataParallel(module, device_ids=device_ids, output_device=output_device)
    out = parallel(torch.randn(batch, 8, device=torch.device("cuda", device_ids[0])))
    out.sum().backward()
    torch.cuda.synchronize()
    ok = out.device == torch.device("cuda", output_device) and out.shape[0] == batch
    detail = (
        "batch %d over %d GPUs, output on cuda:%d" % (batch, gpus, output_device)
        if ok
        else "output on %s with %d rows, expected cuda:%d with %d"
        % (out.device, out.shape[0], output_device, batch)
    )
    return data_parallel_row(ok, detail, **facts)


def data_parallel_main(argv: List[str]) -> int:
    """`program.py --data-parallel CONFIG.json`: the check, written to `data-parallel.json` in out_dir."""
    if len(argv) != 3:
        sys.stderr.write("usage: %s %s CONFIG.json\n" % (argv[0], DATA_PARALLEL_FLAG))
        return 2
    with open(argv[2]) as f:
        config: Json = json.load(f)
    out = os.path.join(str(config["out_dir"]), DATA_PARALLEL_FILE)
    try:
        row = check_data_parallel(config)
    except Exception as exc:  # a CUDA error mid-check: the row says it, and the node fails with it
        row = data_parallel_row(False, "%s: %s" % (type(exc).__name__, exc))
        row["traceback"] = traceback.format_exc().splitlines()[-12:]
        write_json(out, row)
        traceback.print_exc()
        return 1
    write_json(out, row)
    return 0


# Drills, set through the rig's `env`. The rank of this number fails at once, while its peers wait for it:
# it proves that one rank's failure ends the whole run (`smoke --via srun`: Slurm's --kill-on-bad-exit).
FAIL_RANK_ENV = "MGPU_SMOKE_FAIL_RANK"
# Every rank on the host of this name fails at once (a broken node, wherever the ranks are numbered: the
# runs that isolate a bad node renumber them); "NAME:SECONDS" under SLOW_HOST_ENV makes that host's ranks
# wait so long before each timed all_reduce (a slow node: every collective it joins waits for it).
FAIL_HOST_ENV = "MGPU_SMOKE_FAIL_HOST"
SLOW_HOST_ENV = "MGPU_SMOKE_SLOW_HOST"


def drill_delay_s(value: Optional[str], hostname: str) -> float:
    """The slow-node drill's delay for this host: "NAME:SECONDS" naming it, else 0."""
    name, _, seconds = (value or "").rpartition(":")
    try:
        return max(0.0, float(seconds)) if name == hostname else 0.0
    except ValueError:
        return 0.0


def drill_failure(environ: Dict[str, str], rank: str, hostname: str) -> Optional[str]:
    """Why this rank fails on purpose (a drill names it or its host), else None."""
    if environ.get(FAIL_RANK_ENV) == rank:
        return "%s=%s: this rank fails on purpose" % (FAIL_RANK_ENV, rank)
    if environ.get(FAIL_HOST_ENV) == hostname:
        return "%s=%s: every rank of this host fails on purpose" % (FAIL_HOST_ENV, hostname)
    return None


def write_json(path: str, data: Json) -> None:
    """Write-then-rename, so the node side never reads half a file from a rank that is being killed."""
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        json.dump(data, f)
    os.replace(tmp, path)


def main(argv: List[str]) -> int:
    if len(argv) > 1 and argv[1] == DATA_PARALLEL_FLAG:
        return data_parallel_main(argv)
    with open(argv[1]) as f:
        config: Json = json.load(f)
    out = os.path.join(str(config["out_dir"]), "rank-%s.json" % os.environ.get("RANK", "unknown"))
    rank: Optional[Rank] = None
    try:
        failure = drill_failure(dict(os.environ), os.environ.get("RANK", ""), socket.gethostname())
        if failure is not None:
            raise RuntimeError(failure)
        rank = Rank(config)
        rank.run()
    except Exception as exc:  # a broken collective or setup: report it, then fail this rank
        result: Json = (
            rank.result
            if rank is not None
            else {"rank": int(os.environ.get("RANK", "-1")), "hostname": socket.gethostname()}
        )
        result["ok"] = False
        result["error"] = "%s: %s" % (type(exc).__name__, exc)
        result["traceback"] = traceback.format_exc().splitlines()[-12:]
        write_json(out, result)
        traceback.print_exc()
        return 1
    write_json(out, rank.result)
    return 0


def leave(code: int) -> None:
    """End the process without interpreter finalization, once the result is on disk.

    At finalization the garbage collector frees the process group (held by DDP's reducer in a reference
    cycle) while Gloo's worker threads still run; one of them needs the GIL to free its last work object and
    the C++ runtime aborts the rank (SIGABRT, "terminate called without an active exception") after its
    result was written. A failed rank makes its torchrun skip the exit barrier that the peers' torchruns then
    wait in. Nothing is left to do here (every collective is synchronous and done), so the teardown is
    skipped; only the output streams need flushing.
    """
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(OSError, ValueError):  # a closed stream has nothing left to say
            stream.flush()
    os._exit(code)


if __name__ == "__main__":
    leave(main(sys.argv))
