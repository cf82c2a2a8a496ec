"""Our grammar next to ActiveMQ 5.17's own URISupport.parseComposite (a real JVM).

Shows where we agree (parentheses, ``//``, prefix chains keep the options on the inner
failover, masterslave's components) and the one documented difference: in the
parenthesis-free ``failover:u1,u2?q`` ActiveMQ gives ``q`` to the last broker URI, we
give it to the failover (docs/uris.md).
"""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from amqtransport.processes.activemq import activemq_home, java_executable
from amqtransport.uri import CompositeUri, parse_uri

pytestmark = pytest.mark.activemq

PROBE = """
import org.apache.activemq.util.URISupport;
import java.net.URI;
public class Probe {
  public static void main(String[] a) throws Exception {
    for (String s : a) {
      URISupport.CompositeData d = URISupport.parseComposite(new URI(s));
      StringBuilder b = new StringBuilder();
      b.append(d.getScheme()).append('|').append(new java.util.TreeMap<>(d.getParameters())).append('|');
      for (URI c : d.getComponents()) b.append(c).append(' ');
      System.out.println(b.toString().trim());
    }
  }
}
"""

CASES = [
    "failover:(tcp://a:1,tcp://b:2)?randomize=false",
    "failover://(tcp://a:1,tcp://b:2)?randomize=false",
    "static:failover:(tcp://a:1,tcp://b:2)?randomize=false&maxReconnectAttempts=0",
    "masterslave:(tcp://a:1,tcp://b:2)",
    "failover:tcp://a:1,tcp://b:2?randomize=false",
]


@pytest.fixture(scope="module")
def activemq_view(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    home = activemq_home()
    java = java_executable()
    jar = None if home is None else home / "lib" / "activemq-client.jar"
    if java is None or jar is None or not jar.is_file():
        pytest.skip("ActiveMQ 5.17 (activemq-client.jar) and java are needed for this comparison")
    src: Path = tmp_path_factory.mktemp("probe") / "Probe.java"
    src.write_text(PROBE)
    proc = subprocess.run(
        [java, "-cp", str(jar), str(src), *CASES], capture_output=True, text=True, timeout=180
    )
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.strip().splitlines()
    assert len(lines) == len(CASES), proc.stdout
    return dict(zip(CASES, lines, strict=True))


def test_parenthesised_failover_agrees(activemq_view: dict[str, str]) -> None:
    for text in CASES[:2]:
        assert activemq_view[text] == "failover|{randomize=false}|tcp://a:1 tcp://b:2"
        node = parse_uri(text)
        assert isinstance(node, CompositeUri) and node.options.randomize is False  # type: ignore[union-attr]


def test_prefix_chain_keeps_options_on_the_inner_failover(activemq_view: dict[str, str]) -> None:
    text = CASES[2]
    scheme, params, comps = activemq_view[text].split("|")
    assert (scheme, params) == ("static", "{}")
    assert comps == "failover:(tcp://a:1,tcp://b:2)?randomize=false&maxReconnectAttempts=0"
    node = parse_uri(text)
    assert isinstance(node, CompositeUri) and node.scheme == "static"
    assert str(node.components[0]) == comps  # same component text, byte for byte


def test_masterslave_components(activemq_view: dict[str, str]) -> None:
    assert activemq_view[CASES[3]] == "masterslave|{}|tcp://a:1 tcp://b:2"
    node = parse_uri(CASES[3])
    assert [leaf.address for leaf in node.leaves()] == ["tcp://a:1", "tcp://b:2"]


def test_documented_difference_without_parentheses(activemq_view: dict[str, str]) -> None:
    # ActiveMQ: the query stays on the last broker URI
    assert activemq_view[CASES[4]] == "failover|{}|tcp://a:1 tcp://b:2?randomize=false"
    # us: it is the failover's option
    node = parse_uri(CASES[4])
    assert isinstance(node, CompositeUri) and node.options.randomize is False  # type: ignore[union-attr]
    assert [leaf.address for leaf in node.leaves()] == ["tcp://a:1", "tcp://b:2"]
