"""Embodied carbon of a cache disk by medium (CarbonParams.disk_rate): HDD at its cited rate, both SSDs at
the SSD rate, an unknown medium refused, and the media list the simulator's."""

from __future__ import annotations

import pytest
from greenserve.common import carbon
from greenserve.common.carbon_params import DISK_MEDIA, load_default_params
from greenserve.simulator.tiers import DISK_MEDIA as SIMULATED_MEDIA

TB = 10**12
HOUR_S = 3600.0


def test_hdd_carries_an_eighth_of_the_ssd_rate_and_ssds_share_it() -> None:
    params = load_default_params()
    assert params.hdd_embodied_g_per_tb == pytest.approx(3750.0)  # Tannu & Nair 0.02/0.16 of GreenCache's 30 kg
    assert params.disk_rate("nvme") == params.disk_rate("sata-ssd") == params.disk_rate("") == \
        (params.ssd_embodied_g_per_tb, params.ssd_lifetime_s)
    ssd = carbon.cache_tiers_embodied_g(dram_bytes=0, disk_bytes=TB, duration_s=HOUR_S, params=params,
                                        disk_medium="nvme")
    hdd = carbon.cache_tiers_embodied_g(dram_bytes=0, disk_bytes=TB, duration_s=HOUR_S, params=params,
                                        disk_medium="hdd")
    assert hdd == pytest.approx(ssd / 8)
    # No medium named: the SSD rate, as before media were told apart.
    assert carbon.cache_tiers_embodied_g(dram_bytes=0, disk_bytes=TB, duration_s=HOUR_S, params=params) == ssd


def test_overrides_and_unknown_medium() -> None:
    params = load_default_params({"hdd_embodied_g_per_tb": 15_000.0})  # e.g. a vendor's < 2x ratio
    assert params.disk_rate("hdd")[0] == 15_000.0
    with pytest.raises(ValueError, match="tape"):
        params.disk_rate("tape")
    with pytest.raises(ValueError, match="hdd_embodied_g_per_tb"):
        load_default_params({"hdd_embodied_g_per_tb": -1.0})


def test_media_are_the_simulators() -> None:
    assert set(DISK_MEDIA) == set(SIMULATED_MEDIA)
