"""The dataset id a bundle is built with, and the advice printed after: never 'upload' with the placeholder id."""

from __future__ import annotations

from pathlib import Path

from build.bundle.bundler import PLACEHOLDER_ID, choose_dataset_id, upload_advice


def test_the_id_comes_from_the_option_then_the_kaggle_user_then_the_placeholder():
    assert choose_dataset_id("team/arc-bundle", {"KAGGLE_USERNAME": "someone"}) == "team/arc-bundle"
    assert choose_dataset_id(None, {"KAGGLE_USERNAME": "someone"}) == "someone/arc-kit-bundle"
    assert choose_dataset_id(None, {}) == PLACEHOLDER_ID


def test_a_placeholder_id_is_not_called_ready_to_upload():
    advice = upload_advice(Path("out/bundle/dataset"), PLACEHOLDER_ID)
    assert "placeholder" in advice and "--id" in advice and "KAGGLE_USERNAME" in advice
    assert not advice.split(":", 1)[1].strip().startswith("verified; upload")
    ready = upload_advice(Path("out/bundle/dataset"), "someone/arc-kit-bundle")
    assert ready.startswith("out/bundle/dataset: verified; upload as someone/arc-kit-bundle")
