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

Keys (snake_case, ActiveMQ camelCase accepted as aliases): ``mode``, ``master_connector``
(``masterConnectorURI``, ``remoteURI``), ``master_user`` (``userName``),
``master_password`` (``password``), ``wait_for_slave`` (``waitForSlave``),
``shutdown_on_slave_failure`` (``shutdownOnSlaveFailure``),
``shutdown_on_master_failure`` (``shutdownOnMasterFailure``), ``allow_failback``
(``allowFailback``), ``lock_interval`` (seconds), ``takeover_check``, ``ha_port``,
``link_timeout`` (seconds). Command-line flags win over the file. Unknown keys and bad
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


_VALID = (
    "mode, master_connector (masterConnectorURI), master_user (userName), master_password (password), "
    "wait_for_slave (waitForSlave), shutdown_on_slave_failure (shutdownOnSlaveFailure), "
    "shutdown_on_master_failure (shutdownOnMasterFailure), allow_failback (allowFailback), "
    "lock_interval, takeover_check, ha_port, link_timeout"
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
    return ha_table_from_mapping(raw["ha"], str(Path(path)))
