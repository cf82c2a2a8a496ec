"""The ``[ha]`` table of a broker config file (TOML), with ActiveMQ's attribute names.

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
(``allowFailback``), ``lock_interval`` (seconds), ``takeover_check``, ``ha_port``,
``link_timeout`` (seconds), ``cluster_password`` (``clusterPassword``) or
``cluster_password_file`` (``clusterPasswordFile``): the pair's shared secret, required
in replicated mode (see :mod:`.auth`), and the HA port's bounds ``ha_max_connections``
(16), ``ha_idle_timeout`` (5 s) and ``ha_max_frame`` (65536 bytes). A relative
``cluster_password_file`` is relative to the config file. Command-line flags win over the file. Unknown keys and bad
values raise :class:`~amqtransport.errors.ConfigError` naming the key.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

from pydantic import AliasChoices, BaseModel, ConfigDict, Field, ValidationError

from amqtransport.errors import ConfigError

from ..config import read_toml

__all__ = ["HaConfig", "load_ha_table"]


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
    "lock_interval, takeover_check, ha_port, link_timeout, cluster_password (clusterPassword), "
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
