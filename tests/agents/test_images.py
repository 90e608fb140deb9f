"""Screenshot scaling and coordinate mapping: the model's point lands on the screen pixel under its centre,
for every coordinate space an adapter uses."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from pytest_retrace.actions import Action, ActionError
from pytest_retrace.agents.images import Scaler, fit, smart_resize


@pytest.mark.parametrize(("size", "limits", "expected"), [
    ((1280, 800), (1568, 1_150_000), (1280, 800)),  # within Anthropic's limits: never upscaled
    ((1920, 1080), (1568, 1_150_000), (1429, 804)),  # sqrt(1.15e6 / 2.07e6) = 0.745
    ((2560, 1440), (1568, None), (1568, 882)),
    ((1280, 800), (640, None), (640, 400)),
])
def test_fit_follows_the_long_edge_and_pixel_limits(size: tuple[int, int], limits: tuple, expected: tuple) -> None:
    assert fit(size, *limits) == expected


@pytest.mark.parametrize(("size", "expected"), [
    ((1280, 800), (1288, 812)),  # multiples of 28 nearest each side
    ((1920, 1080), (1932, 1092)),
    ((200, 100), (420, 224)),  # below min_pixels (100 * 28 * 28): scaled up
    ((8000, 8000), (3584, 3584)),  # above max_pixels (16384 * 28 * 28): scaled down
])
def test_smart_resize_matches_qwen2_5_vl(size: tuple[int, int], expected: tuple[int, int]) -> None:
    w, h = smart_resize(size)
    assert (w, h) == expected and w % 28 == 0 and h % 28 == 0


def test_half_size_image_maps_each_model_pixel_to_its_screen_pixels() -> None:
    s = Scaler.build((1280, 800), max_long_edge=640)
    assert (s.image, s.space) == ((640, 400), (640, 400))
    assert s.to_screen(9, 15) == (19, 31)  # the centre of model pixel 9 is screen x 19.0
    assert s.to_screen(0, 0) == (1, 1) and s.to_screen(639, 399) == (1279, 799)
    assert s.to_model(19, 31) == (9, 15) and s.to_model(18, 30) == (9, 15)


def test_relative_1000_grid() -> None:
    s = Scaler.build((1280, 800), coordinates="relative-1000")
    assert s.space == (1000, 1000) and s.image == (1280, 800)
    assert s.to_screen(500, 500) == (640, 400) and s.to_screen(999, 999) == (1279, 799)


def test_smart_resize_space_for_ui_tars() -> None:
    s = Scaler.build((1280, 800), coordinates="smart-resize")
    assert s.space == (1288, 812) and s.image == (1280, 800)
    assert s.to_screen(1287, 811) == (1279, 799)


@given(st.sampled_from([(1280, 800), (1920, 1080), (1024, 768)]), st.sampled_from([None, 640, 1000]),
       st.data())
def test_model_points_round_trip_through_the_screen(screen: tuple[int, int], edge: int | None, data) -> None:  # noqa: ANN001
    s = Scaler.build(screen, max_long_edge=edge)
    x = data.draw(st.integers(0, s.space[0] - 1))
    y = data.draw(st.integers(0, s.space[1] - 1))
    sx, sy = s.to_screen(x, y)
    assert 0 <= sx < screen[0] and 0 <= sy < screen[1]
    assert s.to_model(sx, sy) == (x, y)  # downscaling never merges two model pixels


@pytest.mark.parametrize("point", [(640, 10), (-1, 10), (10, 400), (float("nan"), 1), (True, 1), ("3", 1)])
def test_a_point_outside_the_models_image_is_the_models_mistake(point: tuple) -> None:
    with pytest.raises(ActionError):
        Scaler.build((1280, 800), max_long_edge=640).to_screen(*point)


def test_actions_map_both_ends_and_screenshots_shrink() -> None:
    s = Scaler.build((1280, 800), max_long_edge=640)
    assert s.action_to_screen(Action("drag", 9, 15, 100, 200)) == Action("drag", 19, 31, 201, 401)
    assert s.action_to_model(Action("drag", 19, 31, 201, 401)) == Action("drag", 9, 15, 100, 200)
    assert s.action_to_screen(Action("type", text="x")) == Action("type", text="x")
    assert s.resize(np.zeros((800, 1280, 3), dtype=np.uint8)).shape == (400, 640, 3)
