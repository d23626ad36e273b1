"""The worker link of `duet serve --cluster` as a trust boundary (issue 40), against a live PD
server and real `duet worker` processes: a hello nested a million deep costs only its
connection; a process posing as a worker (a well-formed hello from the model's public
config.json) is refused and gets no user request, while a worker holding the secret registers
and serves and one holding another secret is refused with the reason on both sides; silent
connections to the worker port hold up neither a killed worker's return nor the silent-worker
check; worker processes hold none of the HTTP server's sockets; their UCX listeners over tcp
are on loopback only; a load report out of bounds ends that worker's link and never reaches
/metrics."""

import hashlib
import hmac
import json
import os
import re
import signal
import socket
import struct
import subprocess
import time
from pathlib import Path

import pytest

from conftest import DUET, cluster_file, has_ucx, health, wait_for, wait_up, worker_address

SECRET = "a test secret for the worker link"
# The worker link protocol this build speaks (backend/cluster/wire.h kWireVersion); from 2 on a
# hello carries a nonce and the worker proves the secret.
VERSION = 5
PROMPT = "Tell me a story about the sea"


@pytest.fixture(scope="module", autouse=True)
def needs_ucx():
    if not has_ucx():
        pytest.skip("this build has no UCX (libucx-dev): PD worker processes are not tested")


@pytest.fixture
def secret_file(tmp_path):
    path = tmp_path / "secret"
    path.write_text(SECRET + "\n")
    path.chmod(0o600)
    return str(path)


# --- MessagePack, as much as the link's messages use -------------------------------------


def pack(v):
    if v is None:
        return b"\xc0"
    if v is True or v is False:
        return b"\xc3" if v else b"\xc2"
    if isinstance(v, int):
        if 0 <= v < 128:
            return bytes([v])
        if 0 <= v < 2**64:
            return b"\xcf" + struct.pack(">Q", v)
        return b"\xd3" + struct.pack(">q", v)
    if isinstance(v, float):
        return b"\xcb" + struct.pack(">d", v)
    if isinstance(v, str):
        b = v.encode()
        return (bytes([0xa0 | len(b)]) if len(b) < 32 else b"\xdb" + struct.pack(">I", len(b))) + b
    if isinstance(v, bytes):
        return b"\xc6" + struct.pack(">I", len(v)) + v
    if isinstance(v, list):
        return b"\xdd" + struct.pack(">I", len(v)) + b"".join(pack(x) for x in v)
    if isinstance(v, dict):
        return b"\xdf" + struct.pack(">I", len(v)) + b"".join(pack(k) + pack(x)
                                                               for k, x in v.items())
    raise TypeError(v)


def unpack(b, at=0):
    """(value, next offset) of the MessagePack value at `at`."""
    t = b[at]
    if t < 0x80:
        return t, at + 1
    if t >= 0xe0:
        return t - 256, at + 1
    if 0x80 <= t <= 0x8f or t in (0xde, 0xdf):
        n, at = (t & 0x0f, at + 1) if t <= 0x8f else (
            (struct.unpack_from(">H", b, at + 1)[0], at + 3) if t == 0xde else
            (struct.unpack_from(">I", b, at + 1)[0], at + 5))
        out = {}
        for _ in range(n):
            k, at = unpack(b, at)
            out[k], at = unpack(b, at)
        return out, at
    if 0x90 <= t <= 0x9f or t in (0xdc, 0xdd):
        n, at = (t & 0x0f, at + 1) if t <= 0x9f else (
            (struct.unpack_from(">H", b, at + 1)[0], at + 3) if t == 0xdc else
            (struct.unpack_from(">I", b, at + 1)[0], at + 5))
        out = []
        for _ in range(n):
            x, at = unpack(b, at)
            out.append(x)
        return out, at
    if 0xa0 <= t <= 0xbf:
        n = t & 0x1f
        return b[at + 1:at + 1 + n].decode(), at + 1 + n
    fixed = {0xc0: None, 0xc2: False, 0xc3: True}
    if t in fixed:
        return fixed[t], at + 1
    sized = {0xc4: 1, 0xc5: 2, 0xc6: 4, 0xd9: 1, 0xda: 2, 0xdb: 4}
    if t in sized:
        w = sized[t]
        n = int.from_bytes(b[at + 1:at + 1 + w], "big")
        raw = b[at + 1 + w:at + 1 + w + n]
        return (raw if t <= 0xc6 else raw.decode()), at + 1 + w + n
    ints = {0xcc: ">B", 0xcd: ">H", 0xce: ">I", 0xcf: ">Q", 0xd0: ">b", 0xd1: ">h", 0xd2: ">i",
            0xd3: ">q", 0xca: ">f", 0xcb: ">d"}
    fmt = ints[t]
    return struct.unpack_from(fmt, b, at + 1)[0], at + 1 + struct.calcsize(fmt)


# --- Frames -------------------------------------------------------------------------------

HELLO, WELCOME, PEER, ENGINE, EVENTS, HEARTBEAT, CHALLENGE, PROOF = 1, 2, 3, 4, 5, 6, 8, 9


def frame(kind, body, version=VERSION):
    return b"DUET" + struct.pack("<HHI", version, kind, len(body)) + body


def read_frames(sock, timeout=10):
    """Every frame the peer sends until it closes the connection (or `timeout` passes): a list
    of (kind, body)."""
    sock.settimeout(0.2)
    data = b""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            chunk = sock.recv(65536)
        except socket.timeout:
            continue
        except ConnectionResetError:
            break
        if not chunk:
            break
        data += chunk
    frames = []
    while len(data) >= 12:
        _, kind, n = struct.unpack_from("<HHI", data, 4)
        frames.append((kind, data[12:12 + n]))
        data = data[12 + n:]
    return frames


def read_frame(sock, timeout=10):
    sock.settimeout(timeout)
    head = b""
    while len(head) < 12:
        chunk = sock.recv(12 - len(head))
        if not chunk:
            return None
        head += chunk
    _, kind, n = struct.unpack_from("<HHI", head, 4)
    body = b""
    while len(body) < n:
        chunk = sock.recv(n - len(body))
        if not chunk:
            return None
        body += chunk
    return kind, body


def public_hello(model_dir, role, version):
    """A hello as an impostor writes it: every value from the model's public config.json."""
    config = json.loads((Path(model_dir) / "config.json").read_text())
    hello = {"role": {"colocated": 0, "prefill": 1, "decode": 2}[role], "pid": 4242,
             "num_layers": config["num_hidden_layers"], "vocab_size": config["vocab_size"],
             "block_tokens": 16, "kv_bytes_per_token": 0,
             "max_position_embeddings": config.get("max_position_embeddings", 0),
             "num_blocks": 4096, "kv": b"impostor" if role == "prefill" else b""}
    if version >= 2:
        hello["nonce"] = os.urandom(32)
    return pack(hello)


def proof(secret, side, hello_body, nonce):
    label = {"frontend": b"duet worker link v2: frontend\0",
             "worker": b"duet worker link v2: worker\0"}[side]
    return hmac.new(secret.encode(), label + hello_body + nonce, hashlib.sha256).digest()


def register(address, model_dir, role, secret, version):
    """Registers as a worker of `role` speaking protocol `version` (2 on prove `secret`): the
    connected socket once welcomed, else None."""
    host, port = address.split(":")
    sock = socket.create_connection((host, int(port)), timeout=10)
    hello = public_hello(model_dir, role, version)
    sock.sendall(frame(HELLO, hello, version))
    try:
        reply = read_frame(sock)
    except ConnectionResetError:
        reply = None  # refused: another protocol version
    if reply and reply[0] == CHALLENGE and secret is not None:
        challenge, _ = unpack(reply[1])
        assert hmac.compare_digest(challenge["proof"],
                                   proof(secret, "frontend", hello, challenge["nonce"]))
        sock.sendall(frame(PROOF, pack({"proof": proof(secret, "worker", hello,
                                                        challenge["nonce"])}), version))
        reply = read_frame(sock)
    if reply and reply[0] == WELCOME:
        return sock
    sock.close()
    return None


# --- Helpers on a server ------------------------------------------------------------------


def wait_down(server, instance, timeout=15):
    wait_for(lambda: not health(server)[instance]["up"], timeout, lambda: health(server))


def serves(server):
    r = server.client().completions.create(model=server.model, prompt=PROMPT, max_tokens=8,
                                           temperature=0)
    return r.choices[0].finish_reason == "length" and r.usage.completion_tokens == 8


def pd_server(start_server, model, tmp_path, *args):
    return start_server(model, "--threads", "1", "--ucx-tls", "tcp",
                        "--cluster", cluster_file(tmp_path, 1, 1), *args)


def socket_inodes(pid):
    """The inodes of the sockets process `pid` holds."""
    out = set()
    for fd in os.listdir(f"/proc/{pid}/fd"):
        try:
            target = os.readlink(f"/proc/{pid}/fd/{fd}")
        except OSError:
            continue
        m = re.fullmatch(r"socket:\[(\d+)\]", target)
        if m:
            out.add(int(m.group(1)))
    return out


def tcp_sockets():
    """Every TCP socket of this machine: (local address, local port, remote port, state, inode),
    IPv4 and IPv6, addresses as /proc/net/tcp{,6} spell them (hex)."""
    out = []
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        with open(table) as f:
            next(f)
            for line in f:
                fields = line.split()
                local_addr, local_port = fields[1].split(":")
                _, remote_port = fields[2].split(":")
                out.append((local_addr, int(local_port, 16), int(remote_port, 16), fields[3],
                            int(fields[9])))
    return out


LISTEN = "0A"
LOOPBACK = {"0100007F", "00000000000000000000000001000000"}  # 127.0.0.1, ::1


# --- Finding 3 ----------------------------------------------------------------------------


def test_a_hello_nested_a_million_deep_costs_only_its_connection(tiny_model, start_server,
                                                                 tmp_path):
    s = pd_server(start_server, tiny_model, tmp_path)
    def joins():  # (the workers' clock errors move on)
        return [(w["instance"], w["up"], w["joins"]) for w in health(s)]

    before = joins()
    host, port = worker_address(s).split(":")
    body = b"\x91" * 1_000_000 + b"\x01"
    for version in (1, 2, 3, 4, VERSION):  # whichever the server speaks
        with socket.create_connection((host, int(port)), timeout=10) as c:
            try:
                c.sendall(frame(HELLO, body, version))
            except (BrokenPipeError, ConnectionResetError):
                pass  # refused before it read it all
            assert all(kind != WELCOME for kind, _ in read_frames(c, timeout=15))
    assert s.proc.poll() is None, s.stderr()
    assert "nested more than 32 deep" in s.stderr(), s.stderr()
    assert joins() == before  # the workers stayed up, none rejoined
    assert serves(s)
    assert s.stop() == 0, s.stderr()


# --- Finding 4 ----------------------------------------------------------------------------


def test_an_impostor_worker_is_refused_and_gets_no_request(tiny_model, start_server, tmp_path,
                                                           secret_file, monkeypatch):
    monkeypatch.setenv("DUET_WORKER_SECRET", SECRET)  # the server's (its workers inherit it)
    s = pd_server(start_server, tiny_model, tmp_path, "--worker-restarts", "0")
    address = worker_address(s)
    # The decode worker dies and is not started again: its slot is free, as during a restart
    # wait or with --spawn-workers false.
    victim = health(s)[1]["pid"]
    os.kill(victim, signal.SIGKILL)
    wait_down(s, 1)
    host, port = address.split(":")
    impostors = []
    for version in (1, VERSION):
        c = socket.create_connection((host, int(port)), timeout=10)
        c.sendall(frame(HELLO, public_hello(tiny_model, "decode", version), version))
        impostors.append(c)
    # What an impostor of this version can answer a challenge with: anything but the proof.
    time.sleep(0.5)
    try:
        impostors[1].sendall(frame(PROOF, pack({"proof": bytes(32)})))
    except (BrokenPipeError, ConnectionResetError):
        pass  # a server that does not speak this version closed it
    # User requests while the impostors wait: none may reach them.
    for _ in range(4):
        try:
            s.client().completions.create(model=s.model, prompt=PROMPT, max_tokens=4,
                                          temperature=0, timeout=5)
        except Exception:  # noqa: BLE001: with no decode worker the server refuses them
            pass
    for c in impostors:
        kinds = [kind for kind, _ in read_frames(c, timeout=10)]
        assert WELCOME not in kinds and ENGINE not in kinds, kinds
        c.close()
    assert not health(s)[1]["up"], health(s)
    log = s.stderr()
    assert "its proof of the worker secret is wrong" in log, log

    # The real worker, holding the secret, takes the slot and serves.
    worker = subprocess.Popen([DUET, "worker", "--frontend", address, "--role", "decode",
                               "--model", tiny_model, "--threads", "1", "--ucx-tls", "tcp",
                               "--worker-secret-file", secret_file],
                              stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    wait_up(s, 1, joins=2)
    assert serves(s)

    # A worker holding another secret: refused, with the reason on both sides.
    wrong = tmp_path / "wrong"
    wrong.write_text("another secret, not the frontend's")
    r = subprocess.run([DUET, "worker", "--frontend", address, "--role", "decode",
                        "--model", tiny_model, "--threads", "1", "--ucx-tls", "tcp",
                        "--worker-secret-file", str(wrong)],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 1, r
    assert "the frontend did not prove it holds the worker secret" in r.stderr, r.stderr
    wait_for(lambda: "no proof that it holds the worker secret" in s.stderr(), 10, s.stderr)
    assert serves(s)
    assert s.stop() == 0, s.stderr()
    assert worker.wait(timeout=30) == 0, worker.stderr.read()


def test_a_server_taking_workers_from_elsewhere_needs_a_secret(tiny_model, tmp_path):
    r = subprocess.run([DUET, "serve", "--model", tiny_model, "--port", "0",
                        "--cluster", cluster_file(tmp_path, 1, 1), "--spawn-workers", "false"],
                       capture_output=True, text=True, timeout=60,
                       env={k: v for k, v in os.environ.items() if k != "DUET_WORKER_SECRET"})
    assert r.returncode == 2, r
    assert "--worker-secret-file" in r.stderr, r.stderr
    r = subprocess.run([DUET, "worker", "--frontend", "127.0.0.1:1", "--role", "decode",
                        "--model", tiny_model],
                       capture_output=True, text=True, timeout=60,
                       env={k: v for k, v in os.environ.items() if k != "DUET_WORKER_SECRET"})
    assert r.returncode == 2 and "DUET_WORKER_SECRET" in r.stderr, r


def test_the_generated_secret_is_on_no_command_line(tiny_model, start_server, tmp_path):
    s = pd_server(start_server, tiny_model, tmp_path)
    for w in health(s):
        with open(f"/proc/{w['pid']}/cmdline", "rb") as f:
            argv = f.read().split(b"\0")
        with open(f"/proc/{w['pid']}/environ", "rb") as f:
            env = dict(e.split(b"=", 1) for e in f.read().split(b"\0") if b"=" in e)
        secret = env.get(b"DUET_WORKER_SECRET", b"")
        assert len(secret) == 64, env.keys()
        assert all(secret not in a for a in argv)
    assert s.stop() == 0, s.stderr()


# --- Finding 6 ----------------------------------------------------------------------------


def test_silent_connections_hold_up_neither_registration_nor_heartbeat_checks(
        tiny_model, start_server, tmp_path):
    s = pd_server(start_server, tiny_model, tmp_path, "--worker-restarts", "3")
    host, port = worker_address(s).split(":")
    silent = [socket.create_connection((host, int(port)), timeout=10) for _ in range(6)]
    # A killed worker is started again after 0.5 s and rejoins at once (0.8 s unloaded; 40 s
    # when four silent connections went first, 10 s each).
    victim = health(s)[1]["pid"]
    killed = time.monotonic()
    os.kill(victim, signal.SIGKILL)
    wait_up(s, 1, joins=2, timeout=60)
    assert time.monotonic() - killed < 8, s.stderr()
    # More silent connections, and a worker that stops answering: it is found silent after the
    # 5 s heartbeat timeout, not after the connections' turns.
    silent += [socket.create_connection((host, int(port)), timeout=10) for _ in range(6)]
    stopped = health(s)[0]["pid"]
    os.kill(stopped, signal.SIGSTOP)
    t0 = time.monotonic()
    try:
        wait_for(lambda: "worker 0 silent for" in s.stderr(), 30, s.stderr)
        assert time.monotonic() - t0 < 8.5, s.stderr()
    finally:
        os.kill(stopped, signal.SIGCONT)
    for c in silent:
        c.close()
    assert s.stop() == 0, s.stderr()


# --- Findings 8 and 9 ---------------------------------------------------------------------


def test_ucx_listeners_over_tcp_are_on_loopback_only(tiny_model, start_server, tmp_path):
    s = pd_server(start_server, tiny_model, tmp_path)
    listening = 0
    for w in health(s):
        held = socket_inodes(w["pid"])
        for addr, lport, _, state, inode in tcp_sockets():
            if inode in held and state == LISTEN:
                listening += 1
                assert addr in LOOPBACK, (w, addr, lport)
    assert listening > 0  # UCX's tcp transport listens in each worker
    assert serves(s)  # and the KV still moves
    assert s.stop() == 0, s.stderr()


def test_workers_hold_none_of_the_http_sockets(tiny_model, start_server, tmp_path):
    s = pd_server(start_server, tiny_model, tmp_path, "--worker-restarts", "3")

    def http_sockets(client_port=None):
        """The inodes of the HTTP listener and of the server's end of the client connection."""
        found = set()
        for addr, lport, rport, state, inode in tcp_sockets():
            if lport == s.port and (state == LISTEN or rport == client_port):
                found.add(inode)
        return found

    def check_workers(forbidden):
        for w in health(s):
            held = socket_inodes(w["pid"])
            assert not held & forbidden, (w, held & forbidden)

    listener = http_sockets()
    assert listener, tcp_sockets()
    check_workers(listener)
    # An idle keep-alive client connection while a worker is started again.
    conn = s.connection()
    conn.request("GET", "/health")
    assert conn.getresponse().read()
    client_port = conn.sock.getsockname()[1]
    held = http_sockets(client_port)
    assert len(held) == 2 and held <= socket_inodes(s.proc.pid), held
    victim = health(s)[0]["pid"]
    os.kill(victim, signal.SIGKILL)
    wait_up(s, 0, joins=2)
    check_workers(held)
    conn.close()
    assert s.stop() == 0, s.stderr()


# --- Finding 15 ---------------------------------------------------------------------------


def test_a_load_report_out_of_bounds_ends_the_link_and_never_reaches_metrics(
        tiny_model, start_server, tmp_path, monkeypatch):
    monkeypatch.setenv("DUET_WORKER_SECRET", SECRET)
    s = pd_server(start_server, tiny_model, tmp_path, "--worker-restarts", "0")
    address = worker_address(s)
    os.kill(health(s)[1]["pid"], signal.SIGKILL)
    wait_down(s, 1)
    # A worker that holds the secret (whichever protocol the server speaks) reports a load no
    # worker can have.
    sock = register(address, tiny_model, "decode", SECRET, VERSION) or \
        register(address, tiny_model, "decode", SECRET, 1)
    assert sock is not None, s.stderr()
    wait_up(s, 1, joins=2, timeout=10)
    version = VERSION if "this build speaks 1" not in s.stderr() else 1
    load = {"waiting": 0, "running": 2**63 - 1, "kv_used": 0, "kv_free": 4096,
            "kv_total": 4096, "leases_held": 0, "leases_expired": 0, "load_failures": 0,
            "load_recomputes": 0, "forward_failures": 0}
    sock.sendall(frame(HEARTBEAT, pack({"load": load}), version))
    deadline = time.monotonic() + 3
    while time.monotonic() < deadline:
        m = s.metrics()
        assert m["duet:num_requests_running"] < 2**31, m["duet:num_requests_running"]
        time.sleep(0.05)
    wait_down(s, 1)
    assert "rejected a message" in s.stderr(), s.stderr()
    sock.close()
    # Within what the wire allows but past what it said at hello: more requests running than
    # it has KV blocks.
    sock = register(address, tiny_model, "decode", SECRET, version)
    assert sock is not None, s.stderr()
    wait_up(s, 1, joins=3, timeout=10)
    load["running"] = 100_000
    sock.sendall(frame(HEARTBEAT, pack({"load": load}), version))
    deadline = time.monotonic() + 3
    while time.monotonic() < deadline:
        m = s.metrics()
        assert m["duet:num_requests_running"] <= 4096, m["duet:num_requests_running"]
        time.sleep(0.05)
    wait_down(s, 1)
    assert "its load says running 100000" in s.stderr(), s.stderr()
    sock.close()
    assert s.stop() == 0, s.stderr()
