"""One run parses known_hosts once and shares it between connections; accepting a new key stays locked."""

from __future__ import annotations

import dataclasses
import threading
from pathlib import Path

import paramiko
import pytest

from mgpu_provision.fleet.options import FleetOptions
from mgpu_provision.fleet.ssh import _AcceptNew, make_connection
from tests.factories import ssh_target

KEY = paramiko.ECDSAKey.generate()
OTHER = paramiko.ECDSAKey.generate()


def known_hosts_file(tmp_path: Path) -> Path:
    path = tmp_path / "known_hosts"
    path.write_text(f"[10.0.0.1]:2222 {KEY.get_name()} {KEY.get_base64()}\n")
    return path


def test_connections_of_one_run_share_known_hosts_but_not_config(tmp_path: Path) -> None:
    options = FleetOptions(known_hosts=known_hosts_file(tmp_path))
    first = make_connection(ssh_target(name="a"), options)
    second = make_connection(dataclasses.replace(ssh_target(name="b"), address="10.0.0.2"), options)
    assert first.config is not second.config  # invoke writes into a Connection's config: not thread-safe
    assert first.client.get_host_keys() is second.client.get_host_keys()
    assert first.client.get_host_keys().lookup("[10.0.0.1]:2222")[KEY.get_name()] == KEY
    other_run = make_connection(ssh_target(name="a"), FleetOptions(known_hosts=options.known_hosts))
    assert other_run.client.get_host_keys() is not first.client.get_host_keys()  # a new run reads again


def test_a_missing_known_hosts_file_is_an_empty_shared_set(tmp_path: Path) -> None:
    conn = make_connection(ssh_target(name="a"), FleetOptions(known_hosts=tmp_path / "absent"))
    assert len(conn.client.get_host_keys()) == 0


def test_accepting_the_same_new_key_from_many_workers_records_it_once(tmp_path: Path) -> None:
    path = tmp_path / "kh"
    options = FleetOptions(known_hosts=path, accept_new_host_keys=True)
    clients = [make_connection(ssh_target(name=f"w{i}"), options).client for i in range(8)]
    policy = _AcceptNew(path)
    workers = [
        threading.Thread(target=policy.missing_host_key, args=(c, "[10.0.0.9]:22", KEY)) for c in clients
    ]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join()
    assert path.read_text().splitlines() == [f"[10.0.0.9]:22 {KEY.get_name()} {KEY.get_base64()}"]
    assert clients[0].get_host_keys().lookup("[10.0.0.9]:22")[KEY.get_name()] == KEY


def test_a_different_key_accepted_meanwhile_is_a_changed_key(tmp_path: Path) -> None:
    path = tmp_path / "kh"
    options = FleetOptions(known_hosts=path, accept_new_host_keys=True)
    client = make_connection(ssh_target(name="a"), options).client
    policy = _AcceptNew(path)
    policy.missing_host_key(client, "[10.0.0.9]:22", KEY)
    with pytest.raises(paramiko.BadHostKeyException):
        policy.missing_host_key(client, "[10.0.0.9]:22", OTHER)
    assert len(path.read_text().splitlines()) == 1
