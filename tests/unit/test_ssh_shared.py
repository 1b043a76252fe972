"""One run reads known_hosts, key files and ssh_config once and shares them between connections; each
connection checks only its own host's keys; accepting a new key stays locked."""

from __future__ import annotations

import threading
from pathlib import Path

import paramiko
import pytest

from mgpu_provision.fleet.known_hosts import KnownHosts
from mgpu_provision.fleet.options import FleetOptions
from mgpu_provision.fleet.ssh import _AcceptNew, make_connection, shared_ssh
from tests.support.factories import ssh_target

KEY = paramiko.ECDSAKey.generate()
OTHER = paramiko.ECDSAKey.generate()


def line(name: str, key: paramiko.PKey) -> str:
    return f"{name} {key.get_name()} {key.get_base64()}\n"


def known_hosts_file(tmp_path: Path) -> Path:
    path = tmp_path / "known_hosts"
    path.write_text(line("[10.0.0.1]:2222", KEY) + line("[10.0.0.2]:2222", OTHER))
    return path


def test_connections_of_one_run_share_one_parse_but_each_holds_only_its_hosts_keys(tmp_path: Path) -> None:
    options = FleetOptions(known_hosts=known_hosts_file(tmp_path))
    first = make_connection(ssh_target(name="a"), options)
    second = make_connection(ssh_target(name="b")._replace(address="10.0.0.2"), options)
    assert first.config is not second.config  # invoke writes into a Connection's config: not thread-safe
    assert first.config.base_ssh_config is second.config.base_ssh_config  # ssh_config parsed once
    assert list(first.client.get_host_keys().keys()) == ["[10.0.0.1]:2222"]
    assert first.client.get_host_keys().lookup("[10.0.0.1]:2222")[KEY.get_name()] == KEY
    assert list(second.client.get_host_keys().keys()) == ["[10.0.0.2]:2222"]
    parsed = shared_ssh(options).known_hosts(known_hosts_file(tmp_path))
    assert shared_ssh(options).known_hosts(options.known_hosts or tmp_path) is parsed
    other_run = FleetOptions(known_hosts=options.known_hosts)
    make_connection(ssh_target(name="a"), other_run)
    assert shared_ssh(other_run).known_hosts(options.known_hosts or tmp_path) is not parsed  # read again


def test_a_missing_known_hosts_file_is_an_empty_set(tmp_path: Path) -> None:
    conn = make_connection(ssh_target(name="a"), FleetOptions(known_hosts=tmp_path / "absent"))
    assert len(conn.client.get_host_keys()) == 0


def test_hashed_names_match_the_first_key_of_a_type_counts_and_unreadable_lines_are_skipped(
    tmp_path: Path,
) -> None:
    hashed = paramiko.HostKeys.hash_host("[10.0.0.7]:22")
    path = tmp_path / "known_hosts"
    path.write_text(
        "# a comment\n\n"
        f"[10.0.0.7]:22 {KEY.get_name()} not-base64!\n"  # bad base64: skipped, as OpenSSH does
        f"[10.0.0.7]:22 ssh-unknown AAAA\n"  # a key type Paramiko cannot read
        + line(f"other,{hashed}", KEY)
        + line("[10.0.0.7]:22", OTHER)  # same type, later in the file: the first one counts
        + line("[10.0.0.8]:22", OTHER)
    )
    known = KnownHosts(path)
    assert known.keys_of("[10.0.0.7]:22") == {KEY.get_name(): KEY}
    assert known.keys_of("other") == {KEY.get_name(): KEY}
    assert known.keys_of("[10.0.0.9]:22") == {}


def test_accepting_the_same_new_key_from_many_workers_records_it_once(tmp_path: Path) -> None:
    path = tmp_path / "kh"
    options = FleetOptions(known_hosts=path, accept_new_host_keys=True)
    clients = [make_connection(ssh_target(name=f"w{i}"), options).client for i in range(8)]
    known = shared_ssh(options).known_hosts(path)
    policy = _AcceptNew(known)
    workers = [
        threading.Thread(target=policy.missing_host_key, args=(c, "[10.0.0.9]:22", KEY)) for c in clients
    ]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join()
    assert path.read_text().splitlines() == [line("[10.0.0.9]:22", KEY).strip()]
    assert known.keys_of("[10.0.0.9]:22") == {KEY.get_name(): KEY}


def test_a_different_key_accepted_meanwhile_is_a_changed_key(tmp_path: Path) -> None:
    path = tmp_path / "kh"
    options = FleetOptions(known_hosts=path, accept_new_host_keys=True)
    client = make_connection(ssh_target(name="a"), options).client
    policy = _AcceptNew(shared_ssh(options).known_hosts(path))
    policy.missing_host_key(client, "[10.0.0.9]:22", KEY)
    with pytest.raises(paramiko.BadHostKeyException):
        policy.missing_host_key(client, "[10.0.0.9]:22", OTHER)
    assert len(path.read_text().splitlines()) == 1


def test_a_key_file_is_read_once_per_run_and_one_that_needs_a_passphrase_is_left_to_paramiko(
    tmp_path: Path,
) -> None:
    plain, locked = tmp_path / "id_plain", tmp_path / "id_locked"
    KEY.write_private_key_file(str(plain))
    KEY.write_private_key_file(str(locked), password="secret")
    options = FleetOptions(known_hosts=tmp_path / "kh")
    conns = [make_connection(ssh_target(name=f"h{i}", identity_file=str(plain)), options) for i in range(3)]
    assert {id(c.connect_kwargs["pkey"]) for c in conns} == {id(conns[0].connect_kwargs["pkey"])}
    assert "key_filename" not in conns[0].connect_kwargs
    # Paramiko tries the file, then the ssh-agent and the default keys, and says why none worked.
    behind = make_connection(ssh_target(name="x", identity_file=str(locked)), options)
    assert "pkey" not in behind.connect_kwargs
    assert behind.connect_kwargs["key_filename"] == [str(locked)]


def test_a_given_ssh_config_that_does_not_exist_is_an_error(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match="absent"):
        make_connection(ssh_target(name="a"), FleetOptions(ssh_config=tmp_path / "absent"))
