"""Named API tokens: scopes, hashing, revocation, last use; the CLI that manages them."""
from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
from fastapi.testclient import TestClient
from sqlmodel import select

from backend.db import session
from backend.main import create_app
from backend.models import ApiToken
from backend.settings import BackendSettings
from tests.stack import ROOT

ADMIN = {"Authorization": "Bearer s3cret"}
BODY = {"suite": "noop", "params": {}}


@pytest.fixture
def app_client(tmp_path, database_url):
    app = create_app(BackendSettings(data_dir=tmp_path, api_token="s3cret", database_url=database_url),
                     with_recorder=False)
    with TestClient(app) as c:
        c.app_ref = app
        yield c


def bearer(secret):
    return {"Authorization": f"Bearer {secret}"}


def make(c, name, scope):
    r = c.post("/api/tokens", json={"name": name, "scope": scope}, headers=ADMIN)
    assert r.status_code == 201, r.text
    return r.json()["token"]


def test_scopes_read_write_admin(app_client):
    c = app_client
    reader, writer, admin = make(c, "dash", "read"), make(c, "ci", "write"), make(c, "ops", "admin")
    r = c.post("/api/sweeps", json=BODY, headers=bearer(reader))
    assert r.status_code == 403 and "scope read; this needs write" in r.json()["detail"]
    assert c.post("/api/sweeps", json=BODY, headers=bearer(writer)).status_code == 201
    assert c.get("/api/tokens", headers=bearer(writer)).status_code == 403  # managing tokens is admin's
    assert c.get("/api/tokens", headers=bearer(admin)).status_code == 200
    assert c.post("/api/sweeps", json=BODY, headers=bearer("bl_not-a-token")).status_code == 401
    assert c.get("/api/tokens").status_code == 401


def test_tokens_are_stored_hashed_listed_without_secrets_and_note_their_last_use(app_client):
    c = app_client
    secret = make(c, "ci", "write")
    with session(c.app_ref.state.engine) as db:
        row = db.exec(select(ApiToken).where(ApiToken.name == "ci")).one()
        assert secret not in json.dumps(row.model_dump()) and row.prefix == secret[:8]
        assert row.last_used_at is None
    c.post("/api/sweeps", json=BODY, headers=bearer(secret))
    listed = {t["name"]: t for t in c.get("/api/tokens", headers=ADMIN).json()}
    assert listed["ci"]["last_used_at"] is not None and "token" not in listed["ci"]
    assert "token_hash" not in listed["ci"]


def test_revoked_tokens_stop_working_at_once_and_names_stay_taken(app_client):
    c = app_client
    secret = make(c, "ci", "write")
    assert c.delete("/api/tokens/ci", headers=ADMIN).json()["revoked_at"] is not None
    assert c.post("/api/sweeps", json=BODY, headers=bearer(secret)).status_code == 401
    assert c.post("/api/tokens", json={"name": "ci", "scope": "write"}, headers=ADMIN).status_code == 409
    assert c.delete("/api/tokens/nope", headers=ADMIN).status_code == 404
    bad = c.post("/api/tokens", json={"name": "x", "scope": "root"}, headers=ADMIN)
    assert bad.status_code == 422


def test_require_token_without_the_env_token(tmp_path):
    settings = BackendSettings(data_dir=tmp_path, require_token=True)
    app = create_app(settings, with_recorder=False)
    with TestClient(app) as c:
        assert c.post("/api/sweeps", json=BODY).status_code == 401
        from backend import tokens

        with session(app.state.engine) as db:
            _, secret = tokens.create(db, "ci", "write")
        assert c.post("/api/sweeps", json=BODY, headers=bearer(secret)).status_code == 201


def test_token_cli_creates_lists_and_revokes(tmp_path):
    env = {**os.environ, "BENCHLAB_DATA_DIR": str(tmp_path)}

    def cli(*args):
        return subprocess.run([sys.executable, "-m", "backend.cli", "token", *args], cwd=ROOT, env=env,
                              capture_output=True, text=True, timeout=120)

    made = cli("create", "--name", "ci", "--scope", "write")
    assert made.returncode == 0, made.stderr
    secret = made.stdout.strip()
    assert secret.startswith("bl_") and "shown this once" in made.stderr
    assert cli("create", "--name", "ci").returncode == 2  # a name is used once
    assert cli("create", "--name", "x", "--scope", "root").returncode == 2
    listed = json.loads(cli("list").stdout)
    assert [(t["name"], t["scope"], t["revoked_at"]) for t in listed] == [("ci", "write", None)]
    assert secret not in cli("list").stdout
    assert cli("revoke", "ci").returncode == 0
    assert json.loads(cli("list").stdout)[0]["revoked_at"] is not None
    assert cli("revoke", "nope").returncode == 2


def test_a_named_token_signs_a_browser_in_with_its_scope_until_revoked(tmp_path):
    settings = BackendSettings(data_dir=tmp_path, api_token="s3cret", protect_reads=True)
    with TestClient(create_app(settings, with_recorder=False)) as c:
        reader, writer = make(c, "dash", "read"), make(c, "ci", "write")
        assert c.post("/login", data={"token": "bl_wrong", "next": "/"}).status_code == 401
        r = c.post("/login", data={"token": reader, "next": "/"}, follow_redirects=False)
        assert r.status_code == 303 and reader not in r.headers["set-cookie"]  # the cookie is not the secret
        assert c.get("/").status_code == 200 and c.get("/api/sweeps").status_code == 200
        csrf = {"X-CSRF-Token": c.cookies["benchlab_csrf"]}
        denied = c.post("/api/sweeps", json=BODY, headers=csrf)
        assert denied.status_code == 403 and "scope read" in denied.json()["detail"]
        c.post("/login", data={"token": writer, "next": "/"}, follow_redirects=False)
        csrf = {"X-CSRF-Token": c.cookies["benchlab_csrf"]}
        assert c.post("/api/sweeps", json=BODY, headers=csrf).status_code == 201
        assert c.post("/api/sweeps", json=BODY).status_code == 403  # a cookie write still needs the CSRF echo
        c.delete("/api/tokens/ci", headers=ADMIN)
        assert c.get("/api/sweeps").status_code == 401  # revoked: its sessions end at once
        forged = "t.dash." + "0" * 64
        c.cookies.set("benchlab_session", forged)
        assert c.get("/api/sweeps").status_code == 401
