"""Where the directory finds Redis: plain URL or Sentinels, validated at start
(kv_directory/config.py), and the client each builds (no server contacted)."""

from __future__ import annotations

import pytest
from redis.sentinel import SentinelConnectionPool

from kv_directory.config import DirectoryConfig
from kv_directory.redis_store import connect

SENTINELS = {"PD_REDIS_SENTINELS": "s0:26379, s1:26380,10.0.0.3:26381", "PD_REDIS_SENTINEL_MASTER": "pd"}


def test_sentinel_settings_from_the_environment():
    cfg = DirectoryConfig.from_env({**SENTINELS, "PD_REDIS_PASSWORD": "pw", "PD_REDIS_SENTINEL_PASSWORD": "spw"})
    assert cfg.sentinel_addresses() == [("s0", 26379), ("s1", 26380), ("10.0.0.3", 26381)]
    assert cfg.replicas_to_ack == 1  # Sentinel: fence-critical writes wait for a replica
    assert "pw" not in cfg.describe_redis() and "s1:26380" in cfg.describe_redis()
    assert DirectoryConfig.from_env({**SENTINELS, "PD_REDIS_MIN_REPLICAS_ACK": "0"}).replicas_to_ack == 0
    assert DirectoryConfig().replicas_to_ack == 0  # plain Redis: nothing to wait for
    assert DirectoryConfig(redis_min_replicas_ack=2).replicas_to_ack == 2
    # The URL may still carry the password and db, with no host.
    assert DirectoryConfig.from_env({**SENTINELS, "PD_REDIS_URL": "redis://:p%40w@/3"}).sentinel_addresses()


@pytest.mark.parametrize(("env", "message"), [
    ({**SENTINELS, "PD_REDIS_URL": "redis://h:6379/0"}, "with a host: give one of them"),
    ({**SENTINELS, "PD_REDIS_URL": "unix:///tmp/r.sock"}, "Sentinel names a TCP master"),
    ({"PD_REDIS_SENTINELS": "s0:26379"}, "needs PD_REDIS_SENTINEL_MASTER"),
    ({**SENTINELS, "PD_REDIS_SENTINELS": "s0"}, "'s0' is not host:port"),
    ({**SENTINELS, "PD_REDIS_SENTINELS": "s0:0"}, "is not host:port"),
    ({**SENTINELS, "PD_REDIS_SENTINELS": " , "}, "names no host:port"),
    ({"PD_REDIS_SENTINEL_MASTER": "pd"}, "need PD_REDIS_SENTINELS"),
    ({"PD_REDIS_URL": "redis://:a@h/0", "PD_REDIS_PASSWORD": "b"}, "give one of them"),
    ({"PD_REDIS_MIN_REPLICAS_ACK": "-1"}, "PD_REDIS_MIN_REPLICAS_ACK"),
])
def test_contradictions_are_refused_with_a_message(env, message):
    with pytest.raises(ValueError, match=message):
        DirectoryConfig.from_env(env)


def test_connect_follows_the_sentinels():
    cfg = DirectoryConfig.from_env({**SENTINELS, "PD_REDIS_URL": "redis://:p%40w@/3",
                                    "PD_REDIS_SENTINEL_PASSWORD": "spw", "PD_REDIS_TIMEOUT_S": "0.7"})
    client = connect(cfg)
    pool = client.connection_pool
    assert isinstance(pool, SentinelConnectionPool) and pool.service_name == "pd"
    kwargs = pool.connection_kwargs
    assert (kwargs["password"], kwargs["db"], kwargs["socket_timeout"]) == ("p@w", 3, 0.7)
    sentinels = pool.sentinel_manager.sentinels
    assert [s.connection_pool.connection_kwargs["port"] for s in sentinels] == [26379, 26380, 26381]
    assert {s.connection_pool.connection_kwargs["password"] for s in sentinels} == {"spw"}
    client.close()


def test_connect_plain_takes_the_password_variable():
    client = connect(DirectoryConfig(redis_url="redis://h:7000/2", redis_password="pw"))
    kwargs = client.connection_pool.connection_kwargs
    assert (kwargs["host"], kwargs["port"], kwargs["db"], kwargs["password"]) == ("h", 7000, 2, "pw")
    client.close()
