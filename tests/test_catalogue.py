"""The hardware catalogue: every figure sourced and dated, names resolved, prices overridable."""

from __future__ import annotations

import json
import re
import tomllib
from datetime import date

import pytest

from gpu2tpu.pricing.catalogue import (
    DEFAULT_PATH,
    PRICE_FIELDS,
    QUANTITY_FIELDS,
    CatalogueError,
    HardwareCatalogue,
    PriceOverrideError,
    UnknownChip,
    describe_age,
    parse_date,
    parse_quantity,
    source_date,
)

REQUIRED = (
    "v4",
    "v5e",
    "v5p",
    "v6e",
    "tpu7x",
    "t4",
    "l4",
    "a100-40gb",
    "a100-80gb",
    "h100",
    "h200",
    "b200",
    "cpu",
)


@pytest.fixture(scope="module")
def cat() -> HardwareCatalogue:
    return HardwareCatalogue.load()


def test_every_required_chip_is_listed(cat):
    assert set(REQUIRED) <= set(cat.keys())


def test_every_figure_and_missing_price_has_a_dated_source(cat):
    for chip in cat:
        for fld in (*QUANTITY_FIELDS, *PRICE_FIELDS):
            text = chip.sources[fld]
            when = source_date(text)
            assert when is not None and parse_date(when) is not None, (chip.key, fld, text)
            assert parse_date(when) <= date(2026, 12, 31), (chip.key, fld, text)
        assert parse_date(chip.as_of) is not None, chip.key


def test_missing_prices_say_why(cat):
    tpu7x = cat.get("tpu7x")
    assert tpu7x.price_on_demand is None
    assert "not public" in tpu7x.sources["price_on_demand"]


@pytest.mark.parametrize(
    ("key", "peak", "hbm", "bandwidth"),
    [
        # the catalogue's dated sources (hardware.toml), each in its source's own unit
        ("v4", 275e12, 32 * 2**30, 1200e9),
        ("v5e", 197e12, 16 * 2**30, 819e9),
        ("v5p", 459e12, 95 * 2**30, 2765e9),
        ("v6e", 918e12, 32e9, 1638e9),
        ("tpu7x", 2307e12, 192 * 2**30, 7380e9),
        ("h100", 989e12, 80e9, 3350e9),
        ("h200", 989e12, 141e9, 4.8e12),
        ("b200", 2250e12, 180e9, 8e12),
        ("a100-80gb", 312e12, 80e9, 2039e9),
        ("trn2", 667e12, 96 * 2**30, 2.9e12),
    ],
)
def test_figures_and_units(cat, key, peak, hbm, bandwidth):
    chip = cat.get(key)
    assert chip.peak_bf16_flops == pytest.approx(peak)
    assert chip.hbm_bytes == pytest.approx(hbm)
    assert chip.hbm_bandwidth == pytest.approx(bandwidth)


def test_slice_prices_match_the_division_in_their_source(cat):
    """A source written as '$12.88/h / 4 chips' must give the per-chip price in the file."""
    checked = 0
    pattern = re.compile(r"\$([0-9,.]+)/h / ([0-9]+)")
    for chip in cat:
        for fld in PRICE_FIELDS:
            match = pattern.search(chip.sources[fld])
            if match:
                total, count = float(match.group(1).replace(",", "")), int(match.group(2))
                assert getattr(chip, fld) == pytest.approx(total / count, rel=0.005), (
                    chip.key,
                    fld,
                )
                checked += 1
    assert checked >= 8


@pytest.mark.parametrize(
    ("name", "key"),
    [
        ("v5e", "v5e"),
        ("V5E", "v5e"),
        ("TPU v5e", "v5e"),
        ("TPU v5 lite", "v5e"),
        ("v5litepod", "v5e"),
        ("TPU v6 lite", "v6e"),
        ("Trillium", "v6e"),
        ("TPU v5", "v5p"),
        ("TPU7x", "tpu7x"),
        ("Ironwood", "tpu7x"),
        ("H100 80GB", "h100"),
        ("NVIDIA H100 80GB HBM3", "h100"),
        ("NVIDIA A100-SXM4-40GB", "a100-40gb"),
        ("NVIDIA A100-SXM4-80GB", "a100-80gb"),
        ("Tesla T4", "t4"),
        ("NVIDIA L4", "l4"),
        ("Trainium2", "trn2"),
    ],
)
def test_names_and_aliases(cat, name, key):
    assert cat.get(name).key == key


@pytest.mark.parametrize(
    "runtime_name",
    [
        "TPU v5 lite",
        "TPU v6 lite",
        "TPU v4",
        "TPU7x",
        "NVIDIA H100 80GB HBM3",
        "NVIDIA A100-SXM4-80GB",
        "Tesla T4",
        "NVIDIA B200",
    ],
)
def test_agrees_with_the_backends_chip_kind(cat, runtime_name):
    from gpu2tpu.backends import chip_kind

    assert cat.get(runtime_name).key == chip_kind(runtime_name)


def test_unknown_chip_lists_the_known_ones(cat):
    with pytest.raises(UnknownChip) as err:
        cat.get("tpu v9")
    assert isinstance(err.value, KeyError)
    message = str(err.value)
    for key in REQUIRED:
        assert key in message
    with pytest.raises(UnknownChip, match="a100-40gb or a100-80gb"):
        cat.get("a100")
    assert cat.find("tpu v9") is None


def test_chips_by_kind(cat):
    assert {c.key for c in cat.chips("tpu")} == {"v4", "v5e", "v5p", "v6e", "tpu7x"}
    assert {c.key for c in cat.chips("trainium")} == {"trn2"}
    assert all(c.kind == "gpu" for c in cat.chips("gpu"))
    assert len(cat.chips()) == len(cat)
    with pytest.raises(ValueError, match="chip kind"):
        cat.chips("fpga")


def test_overrides_from_a_dict(cat):
    cheap = cat.with_overrides({"TPU v5e": {"price_on_demand": 0.9, "note": "our discount"}})
    assert cheap.get("v5e").price_on_demand == 0.9
    assert cheap.get("v5e").price_spot == cat.get("v5e").price_spot
    assert "our discount" in cheap.get("v5e").sources["price_on_demand"]
    assert cat.get("v5e").price_on_demand == 1.20  # the original is unchanged
    used = cheap.prices_used(["v5e", "h100"])
    assert used["overrides"] == {"v5e": {"price_on_demand": 0.9, "note": "our discount"}}
    assert used["prices"] == {"v5e": 0.9, "h100": 10.98}
    assert (
        HardwareCatalogue.load(overrides={"tpu7x": {"price_on_demand": 5}})
        .get("tpu7x")
        .price_on_demand
        == 5
    )


def test_overrides_from_toml_and_json_files(tmp_path):
    toml = tmp_path / "prices.toml"
    toml.write_text("[v6e]\nprice_on_demand = 1.5\nprice_spot = 0.5\n")
    loaded = HardwareCatalogue.load(overrides=toml)
    assert (loaded.get("v6e").price_on_demand, loaded.get("v6e").price_spot) == (1.5, 0.5)
    assert loaded.override_source == str(toml)
    js = tmp_path / "prices.json"
    js.write_text(json.dumps({"prices": {"h100": {"price_on_demand": 2.5}}}))
    assert HardwareCatalogue.load(overrides=js).get("h100").price_on_demand == 2.5


@pytest.mark.parametrize(
    ("overrides", "named"),
    [
        ({"v5e": {"price_ondemand": 1}}, "v5e.price_ondemand"),
        ({"v5e": {"price_on_demand": "0.9$"}}, "v5e.price_on_demand"),
        ({"v5e": {"price_spot": -1}}, "v5e.price_spot"),
        ({"v5e": {"price_spot": float("nan")}}, "v5e.price_spot"),
        ({"v5e": {"price_on_demand": True}}, "v5e.price_on_demand"),
        ({"v5e": 0.9}, "'v5e'"),
        ({"tpu9": {"price_on_demand": 1}}, "'tpu9'"),
    ],
)
def test_malformed_overrides_name_the_bad_field(cat, overrides, named):
    with pytest.raises(PriceOverrideError) as err:
        cat.with_overrides(overrides)
    assert named in str(err.value)


def test_malformed_override_files_name_the_file(tmp_path, cat):
    bad = tmp_path / "bad.toml"
    bad.write_text("[v5e\nprice_on_demand = ")
    with pytest.raises(PriceOverrideError, match="bad.toml: not valid TOML"):
        cat.with_overrides(bad)
    with pytest.raises(PriceOverrideError, match="cannot be read"):
        cat.with_overrides(tmp_path / "missing.json")


def _write_catalogue(tmp_path, mutate):
    data = tomllib.loads(DEFAULT_PATH.read_text())
    mutate(data)
    lines = []
    for key, chip in data["chips"].items():
        lines.append(f"[chips.{key}]")
        for fld, value in chip.items():
            if fld != "sources":
                lines.append(f"{fld} = {json.dumps(value)}")
        lines.append(f"[chips.{key}.sources]")
        for fld, value in chip["sources"].items():
            lines.append(f"{fld} = {json.dumps(value)}")
    path = tmp_path / "hw.toml"
    path.write_text("\n".join(lines))
    return path


def test_a_figure_without_a_dated_source_is_refused(tmp_path):
    path = _write_catalogue(
        tmp_path, lambda d: d["chips"]["v5e"]["sources"].update(hbm_bytes="a blog")
    )
    with pytest.raises(CatalogueError, match=r"chips\.v5e\]\.sources\.hbm_bytes"):
        HardwareCatalogue.load(path)


def test_a_bad_unit_is_refused(tmp_path):
    path = _write_catalogue(
        tmp_path, lambda d: d["chips"]["v6e"].update(hbm_bandwidth="1638 furlongs")
    )
    with pytest.raises(CatalogueError, match="furlongs"):
        HardwareCatalogue.load(path)


def test_the_rewritten_catalogue_round_trips(tmp_path, cat):
    again = HardwareCatalogue.load(_write_catalogue(tmp_path, lambda d: None))
    assert [c.to_dict() for c in again] == [c.to_dict() for c in cat]


def test_quantities_and_dates():
    assert parse_quantity("4.8 TB/s", where="x") == 4.8e12
    assert parse_quantity("16 GiB", where="x") == 16 * 2**30
    assert parse_quantity("2,307 TFLOP/s", where="x") == 2307e12
    with pytest.raises(CatalogueError):
        parse_quantity("fast", where="x")
    today = date(2026, 11, 30)
    assert describe_age("2026-09-26", today) == "as of 2026-09-26, 65 days old"
    assert "exact date unknown" in describe_age("2026", today)


def test_the_docs_table_matches_the_catalogue(cat):
    """docs/profiler.md lists every chip's figures and prices; they must not drift apart."""
    from pathlib import Path

    docs = (Path(__file__).resolve().parent.parent / "docs" / "profiler.md").read_text()
    seen = set()
    for line in docs.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) != 8 or not re.fullmatch(r"`[a-z0-9-]+`", cells[0]):
            continue
        chip = cat.get(cells[0].strip("`"))
        seen.add(chip.key)
        number = lambda text: None if text == "—" else float(text)  # noqa: E731
        assert float(cells[2]) * 1e12 == pytest.approx(chip.peak_bf16_flops), chip.key
        assert float(cells[4]) * 1e9 == pytest.approx(chip.hbm_bandwidth), chip.key
        assert number(cells[5]) == chip.price_on_demand, chip.key
        assert number(cells[6]) == chip.price_spot, chip.key
        assert cells[7] == chip.as_of, chip.key
    assert seen == set(cat.keys())
