"""An HA node's options: :class:`HaOptions` (validated; what ``amq broker run --ha``
builds from its flags and the ``[ha]`` table), :class:`HaPortLimits`, :func:`parse_address`;
and the ``[ha]`` table of a broker config file (TOML), with ActiveMQ's attribute names.

Example::

    [broker]
    port = 61614
    data_dir = "data-b"

    [ha]
    mode = "replicated"
    masterConnectorURI = "tcp://127.0.0.1:61623"   # or master_connector
    userName = "admin"                             # or master_user
    password = "secret"                            # or master_password
    shutdownOnMasterFailure = false
    cluster_password_file = "/etc/amq/cluster.secret"  # the same secret on both nodes

Keys (snake_case, ActiveMQ camelCase accepted as aliases): ``mode``, ``master_connector``
(``masterConnectorURI``, ``remoteURI``), ``master_user`` (``userName``),
``master_password`` (``password``), ``wait_for_slave`` (``waitForSlave``),
``shutdown_on_slave_failure`` (``shutdownOnSlaveFailure``),
``shutdown_on_master_failure`` (``shutdownOnMasterFailure``), ``allow_failback``
(``allowFailback``), ``lock_interval`` (seconds), ``takeover_check``, ``witness``
(``HOST:PORT`` of an ``amq broker witness``: see :mod:`.witness`), ``relay_port``
(a node that is not master relays clients to its live master on this port: :mod:`.relay`), ``ha_port``,
``link_timeout`` (seconds), ``cluster_password`` (``clusterPassword``) or
``cluster_password_file`` (``clusterPasswordFile``): the pair's shared secret, required
in replicated mode and with a witness (see :mod:`.auth`), and the HA port's bounds ``ha_max_connections``
(16), ``ha_idle_timeout`` (5 s) and ``ha_max_frame`` (65536 bytes). A relative
``cluster_password_file`` is relative to the config file. Command-line flags win over the file. Unknown keys and bad
values raise :class:`~amqtransport.errors.ConfigError` naming the key.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from pydantic import AliasChoices, BaseModel, ConfigDict, Field, ValidationError

from amqtransport.errors import ConfigError

from ..config import read_toml
from .auth import load_secret

__all__ = ["HaConfig", "HaOptions", "HaPortLimits", "load_ha_table", "options_from_kwargs", "parse_address"]

class HaConfig(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, populate_by_name=True)

    mode: Literal["shared-store", "replicated"] | None = None
    master_connector: str | None = Field(
        None, validation_alias=AliasChoices("master_connector", "masterConnectorURI", "remoteURI")
    )
    master_user: str | None = Field(None, validation_alias=AliasChoices("master_user", "userName"))
    master_password: str | None = Field(None, validation_alias=AliasChoices("master_password", "password"))
    wait_for_slave: bool | None = Field(None, validation_alias=AliasChoices("wait_for_slave", "waitForSlave"))
    shutdown_on_slave_failure: bool | None = Field(
        None, validation_alias=AliasChoices("shutdown_on_slave_failure", "shutdownOnSlaveFailure")
    )
    shutdown_on_master_failure: bool | None = Field(
        None, validation_alias=AliasChoices("shutdown_on_master_failure", "shutdownOnMasterFailure")
    )
    allow_failback: bool | None = Field(None, validation_alias=AliasChoices("allow_failback", "allowFailback"))
    lock_interval: float | None = Field(None, gt=0)
    takeover_check: str | None = None
    witness: str | None = None
    relay_port: int | None = Field(None, ge=0, le=65535)
    ha_port: int | None = Field(None, ge=0, le=65535)
    link_timeout: float | None = Field(None, gt=0)
    cluster_password: str | None = Field(
        None, validation_alias=AliasChoices("cluster_password", "clusterPassword")
    )
    cluster_password_file: str | None = Field(
        None, validation_alias=AliasChoices("cluster_password_file", "clusterPasswordFile")
    )
    ha_max_connections: int | None = Field(None, ge=1)
    ha_idle_timeout: float | None = Field(None, gt=0)
    ha_max_frame: int | None = Field(None, ge=1024)


_VALID = (
    "mode, master_connector (masterConnectorURI), master_user (userName), master_password (password), "
    "wait_for_slave (waitForSlave), shutdown_on_slave_failure (shutdownOnSlaveFailure), "
    "shutdown_on_master_failure (shutdownOnMasterFailure), allow_failback (allowFailback), "
    "lock_interval, takeover_check, witness, relay_port, ha_port, link_timeout, cluster_password (clusterPassword), "
    "cluster_password_file (clusterPasswordFile), ha_max_connections, ha_idle_timeout, ha_max_frame"
)


def ha_table_from_mapping(data: Any, source: str = "config") -> dict[str, Any]:
    """Validate an ``[ha]`` table; returns the keys that are set (snake_case)."""
    if not isinstance(data, dict):
        raise ConfigError(f"{source}: [ha] must be a table", path="ha")
    try:
        model = HaConfig.model_validate(data)
    except ValidationError as exc:
        err = exc.errors()[0]
        key = ".".join(str(x) for x in err["loc"]) or "ha"
        if err["type"] == "extra_forbidden":
            raise ConfigError(f"{source}: unknown key 'ha.{key}' (valid keys: {_VALID})", path=f"ha.{key}") from None
        raise ConfigError(f"{source}: key 'ha.{key}': {err['msg']}", path=f"ha.{key}") from None
    return {k: v for k, v in model.model_dump().items() if v is not None}


def load_ha_table(path: str | Path) -> dict[str, Any]:
    """The validated ``[ha]`` table of a TOML config file ({} when there is none)."""
    raw = read_toml(path)
    if "ha" not in raw:
        return {}
    table = ha_table_from_mapping(raw["ha"], str(Path(path)))
    secret_file = table.get("cluster_password_file")
    if secret_file is not None and not Path(secret_file).is_absolute():
        table["cluster_password_file"] = str(Path(path).resolve().parent / secret_file)
    return table


# ---------------------------------------------------------------------- the node's options
MODES = ("shared-store", "replicated")


@dataclass(frozen=True)
class HaOptions:
    mode: str = "replicated"
    master_connector: str | None = None
    master_user: str | None = None
    master_password: str | None = None
    wait_for_slave: bool = False
    shutdown_on_slave_failure: bool = False
    shutdown_on_master_failure: bool = False
    allow_failback: bool = False
    lock_interval: float = 0.1
    takeover_check: str | None = None
    witness: str | None = None  # HOST:PORT of the pair's witness (witness.py); None: the CP default
    relay_port: int | None = None  # not master but knowing a live master: relay clients to it here (relay.py)
    ha_port: int = 0
    link_timeout: float = 2.0
    cluster_password: str | None = None
    cluster_password_file: str | None = None
    ha_max_connections: int = 16
    ha_idle_timeout: float = 5.0
    ha_max_frame: int = 64 * 1024

    def validate(self) -> None:
        if self.mode not in MODES:
            raise ConfigError(f"--ha must be one of {', '.join(MODES)}, got {self.mode!r}", path="ha")
        if self.mode == "shared-store" and self.master_connector:
            raise ConfigError("--master-connector is for --ha replicated (shared-store nodes share --data-dir)",
                              path="master_connector")
        if self.master_connector:
            parse_address(self.master_connector, "--master-connector")
        if self.takeover_check:
            parse_address(self.takeover_check, "--takeover-check")
        if self.witness:
            parse_address(self.witness, "--witness")
            if self.mode == "shared-store" and self.allow_failback:
                raise ConfigError("--allow-failback does not go with --witness on a shared store (the witness's "
                                  "lease decides who is master, not a failback request)", path="allow_failback")
        if not 0.001 <= self.lock_interval <= 60:
            raise ConfigError(f"--lock-interval must be between 0.001 and 60 s, got {self.lock_interval}",
                              path="lock_interval")
        if not 0.05 <= self.link_timeout <= 600:
            raise ConfigError(f"--link-timeout must be between 0.05 and 600 s, got {self.link_timeout}",
                              path="link_timeout")
        if (self.master_user is None) != (self.master_password is None):
            raise ConfigError("--master-user and --master-password go together", path="master_user")
        if self.mode == "replicated" or self.witness:  # the witness knows a pair by its secret
            load_secret(self.cluster_password, self.cluster_password_file)
        if self.relay_port is not None and not 0 <= self.relay_port <= 65535:
            raise ConfigError(f"--relay-port must be a port number (0: a free one), got {self.relay_port}",
                              path="relay_port")
        if self.relay_port and self.relay_port == self.ha_port:
            raise ConfigError(f"--relay-port and --ha-port must differ, both are {self.relay_port}", path="relay_port")
        if not 1 <= self.ha_max_connections <= 10_000:
            raise ConfigError(f"ha_max_connections must be between 1 and 10000, got {self.ha_max_connections}",
                              path="ha_max_connections")
        if not 0.1 <= self.ha_idle_timeout <= 600:
            raise ConfigError(f"ha_idle_timeout must be between 0.1 and 600 s, got {self.ha_idle_timeout}",
                              path="ha_idle_timeout")
        if not 1024 <= self.ha_max_frame <= 16 << 20:
            raise ConfigError(f"ha_max_frame must be between 1024 and 16777216 bytes, got {self.ha_max_frame}",
                              path="ha_max_frame")

    @property
    def port_limits(self) -> HaPortLimits:
        return HaPortLimits(self.ha_max_connections, self.ha_idle_timeout, self.ha_max_frame)


def parse_address(text: str, what: str = "address") -> tuple[str, int]:
    """``tcp://host:port``, ``stomp://host:port`` or ``host:port`` -> (host, port)."""
    raw = text.strip()
    for prefix in ("tcp://", "stomp://"):
        if raw.startswith(prefix):
            raw = raw[len(prefix):]
    raw = raw.split("?", 1)[0].rstrip("/")
    host, sep, port = raw.rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise ConfigError(f"{what}: expected tcp://HOST:PORT or HOST:PORT, got {text!r}", path=what)
    return host.strip("[]"), int(port)


def options_from_kwargs(kwargs: Mapping[str, Any]) -> HaOptions:
    """HaOptions from the ``amq broker run`` keyword arguments (None = default)."""
    fields = HaOptions.__dataclass_fields__
    values = {k: v for k, v in kwargs.items() if k in fields and v is not None}
    return HaOptions(**values)


@dataclass(frozen=True)
class HaPortLimits:
    """Bounds of the HA port (``[ha]`` keys ``ha_max_connections``, ``ha_idle_timeout``,
    ``ha_max_frame``)."""

    max_connections: int = 16
    idle_timeout: float = 5.0
    max_frame: int = 64 * 1024
