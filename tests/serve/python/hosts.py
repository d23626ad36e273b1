"""Hosts for tests: Linux network namespaces on one LAN, each with an `eth0` joined by a veth pair
to a bridge in a namespace of its own, and this test process (the root namespace) on the same
LAN as the client host. Addresses come from 198.18.0.0/15 (set aside for network tests, RFC
2544), in a /24 no route of this machine uses. Everything is torn down on exit, also when the test
failed: deleting the namespaces deletes their veth pairs, the root namespace's end included.
Needs root and `ip` (iproute2); `available()` says why not. Links can be shaped with `tc tbf`."""

import ipaddress
import os
import shutil
import subprocess


def _ip(*args, check=True):
    return subprocess.run(["ip", *args], capture_output=True, text=True, check=check)


def available():
    """None when this machine can make hosts, else why not."""
    if os.geteuid() != 0:
        return "network namespaces need root"
    if shutil.which("ip") is None:
        return "no ip command (iproute2)"
    probe = f"duet-probe-{os.getpid()}"
    r = _ip("netns", "add", probe, check=False)
    if r.returncode != 0:
        return f"ip netns add: {r.stderr.strip()}"
    _ip("netns", "del", probe, check=False)
    return None


def _free_subnet():
    used = []
    for word in _ip("-4", "route", "show", "table", "all").stdout.split():
        try:
            used.append(ipaddress.ip_network(word, strict=False))
        except ValueError:
            pass  # not an address
    for i in range(256):
        net = ipaddress.ip_network(f"198.18.{(os.getpid() + i) % 256}.0/24")
        if not any(net.overlaps(u) for u in used):
            return net
    raise RuntimeError("no free /24 in 198.18.0.0/16")


def listening(prefix=()):
    """The TCP addresses listened on (IPv4, "a.b.c.d:port"), in this namespace or in the one
    `prefix` runs a command in (Hosts.run)."""
    out = subprocess.run([*prefix, "cat", "/proc/net/tcp"], capture_output=True, text=True,
                         check=True).stdout
    found = []
    for line in out.splitlines()[1:]:
        fields = line.split()
        if fields[3] == "0A":  # LISTEN
            addr, port = fields[1].split(":")
            octets = [str(int(addr[i:i + 2], 16)) for i in (6, 4, 2, 0)]
            found.append(f"{'.'.join(octets)}:{int(port, 16)}")
    return found


class Hosts:
    """with Hosts(["frontend", "prefill", "decode"]) as hosts: hosts.address("prefill"),
    hosts.run("prefill") (a command prefix), hosts.shape("decode", "500mbit")."""

    def __init__(self, names):
        self.names = list(names)
        self.tag = f"dt{os.getpid() % 100000}"
        self.hub = f"duet-{self.tag}-hub"
        self.net = _free_subnet()
        hosts = list(self.net.hosts())
        self.client = str(hosts[0])  # this process's address on the LAN
        self._addresses = {name: str(hosts[i + 1]) for i, name in enumerate(self.names)}
        self._made = []

    def namespace(self, name):
        return f"duet-{self.tag}-{name}"

    def address(self, name):
        return self._addresses[name]

    def run(self, name):
        """The prefix that runs a command on host `name`."""
        return ["ip", "netns", "exec", self.namespace(name)]

    def shape(self, name, rate, burst="64kb", latency="100ms"):
        """Shapes what host `name` sends with a token bucket (tc tbf) on its eth0."""
        subprocess.run([*self.run(name), "tc", "qdisc", "replace", "dev", "eth0", "root", "tbf",
                        "rate", rate, "burst", burst, "latency", latency], check=True)

    def __enter__(self):
        try:
            self._add_namespace(self.hub)
            _ip("-n", self.hub, "link", "add", "br0", "type", "bridge")
            _ip("-n", self.hub, "link", "set", "br0", "up")
            # This process's end: an interface of the root namespace, deleted with the hub.
            client_if = f"{self.tag}c"
            self._veth(client_if, None)
            _ip("addr", "add", f"{self.client}/{self.net.prefixlen}", "dev", client_if)
            _ip("link", "set", client_if, "up")
            for i, name in enumerate(self.names):
                ns = self.namespace(name)
                self._add_namespace(ns)
                end = f"{self.tag}h{i}"
                self._veth(end, ns)
                _ip("-n", ns, "link", "set", end, "name", "eth0")
                _ip("-n", ns, "addr", "add", f"{self.address(name)}/{self.net.prefixlen}",
                    "dev", "eth0")
                _ip("-n", ns, "link", "set", "eth0", "up")
                _ip("-n", ns, "link", "set", "lo", "up")
        except BaseException:
            self.__exit__(None, None, None)
            raise
        return self

    def _add_namespace(self, ns):
        _ip("netns", "add", ns)
        self._made.append(ns)

    def _veth(self, end, ns):
        """A veth pair: `end` in namespace `ns` (None: the root one), its peer on the bridge."""
        peer = f"{end}p"
        _ip("link", "add", end, "type", "veth", "peer", "name", peer)
        _ip("link", "set", peer, "netns", self.hub)
        _ip("-n", self.hub, "link", "set", peer, "master", "br0")
        _ip("-n", self.hub, "link", "set", peer, "up")
        if ns is not None:
            _ip("link", "set", end, "netns", ns)

    def __exit__(self, *exc):
        _ip("link", "del", f"{self.tag}c", check=False)  # else gone with the hub, a while later
        for ns in reversed(self._made):
            _ip("netns", "del", ns, check=False)
        self._made.clear()
        return False
