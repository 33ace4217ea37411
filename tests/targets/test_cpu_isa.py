"""CPU instruction sets: detection, the named cpu profiles and the int8 weight range each implies
(the ISA in session.json / report.json and `passctl run`'s warning: tests/cli/test_cli_cpu_isa.py)."""

from __future__ import annotations

import pytest

from passctl.targets import get_target, list_targets
from passctl.support import cpu_isa
from passctl.support.cpu_isa import CpuIsa, host_isa


def _cpuinfo(tmp_path, monkeypatch, text: str) -> CpuIsa:
    """host_isa() on a fake /proc/cpuinfo holding ``text``."""
    path = tmp_path / "cpuinfo"
    path.write_text(text)
    real_open = open
    monkeypatch.setattr("builtins.open", lambda f, *a, **k: real_open(
        path if f == "/proc/cpuinfo" else f, *a, **k))
    host_isa.cache_clear()
    try:
        return host_isa()
    finally:
        host_isa.cache_clear()


@pytest.mark.parametrize("flags,name,saturates", [
    # an AMD EPYC (Zen 3) as these machines have: AVX2, no AVX-512, no VNNI
    ("fpu sse sse2 ssse3 fma sse4_1 avx f16c avx2 bmi2 sha_ni vaes", "avx2", True),
    ("avx2 avx512f avx512bw avx512cd", "avx512", True),  # Skylake-SP
    ("avx2 avx512f avx512bw avx512_vnni", "vnni", False),  # Cascade Lake
    ("avx2 avx_vnni", "vnni", False),  # Alder Lake (AVX-VNNI, no AVX-512)
    ("avx2 avx512f avx512bw avx512_vnni amx_int8 amx_tile", "amx", False),  # Sapphire Rapids
])
def test_x86_flags_give_the_isa(tmp_path, monkeypatch, flags, name, saturates):
    monkeypatch.setattr(cpu_isa, "_arch", lambda: "x86_64")
    isa = _cpuinfo(tmp_path, monkeypatch, f"processor\t: 0\nflags\t\t: {flags}\n\n")
    assert isa.name == name and isa.u8s8_saturates is saturates
    assert isa.int8_weight_qmax == (63 if saturates else 127)
    # pairs of u8 x s8 products fit int16 exactly when the weights are 7-bit
    assert (2 * 255 * isa.int8_weight_qmax <= 32767) is saturates


def test_arm_features_give_the_isa(tmp_path, monkeypatch):
    monkeypatch.setattr(cpu_isa, "_arch", lambda: "aarch64")
    isa = _cpuinfo(tmp_path, monkeypatch, "processor\t: 0\nFeatures\t: fp asimd aes crc32 asimddp\n")
    assert isa.name == "arm64-dotprod" and not isa.u8s8_saturates and isa.int8_weight_qmax == 127


def test_host_isa_matches_proc_cpuinfo():
    # independently read: the flags line of this machine's /proc/cpuinfo
    with open("/proc/cpuinfo") as f:
        line = next((l for l in f if l.split(":")[0].strip() in ("flags", "Features")), "")
    flags = set(line.partition(":")[2].split())
    isa = host_isa()
    assert set(isa.features) == flags & set(cpu_isa.KNOWN_FEATURES)
    if isa.arch == "x86_64":
        vnni = bool(flags & {"avx512_vnni", "avx_vnni", "amx_int8"})
        assert isa.u8s8_saturates is not vnni


def test_cpu_profiles_carry_their_isa():
    host = get_target("cpu")
    assert host.isa == host_isa() and not host.is_gpu and host_isa().name in host.description
    names = [t.name for t in list_targets()]
    for key in ("avx2", "avx512", "vnni", "amx", "arm64", "arm64-dotprod"):
        t = get_target(f"cpu-{key}")
        assert f"cpu-{key}" in names and t.isa.name == key and not t.is_gpu
        assert t.to_dict()["isa"]["name"] == key
        assert CpuIsa.from_dict(t.to_dict()["isa"]) == t.isa
    assert get_target("cpu-avx2").isa.u8s8_saturates and not get_target("cpu-vnni").isa.u8s8_saturates
    assert get_target("a10").isa is None and "isa" not in get_target("a10").to_dict()
