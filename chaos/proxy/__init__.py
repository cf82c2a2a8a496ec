"""The Toxiproxy-compatible proxy: TCP proxies with toxics, driven by Toxiproxy's REST API.

- :mod:`.proxy`: one proxy (a listener, its connection pairs, their toxic pipelines),
  with the theory of operation; :mod:`.toxics`: one class per Toxiproxy toxic type;
  :mod:`.listener`: an accept loop that closes without losing a socket;
  :mod:`.addresses`: ``host:port`` as Toxiproxy spells it.
- :mod:`.collection`: the set of proxies a server manages (Toxiproxy's rules per API
  operation); :mod:`.http_api`: the REST API (served by the broker's h11 server,
  :mod:`amqtransport.broker.http.h11_server`); :mod:`.errors`: the API's errors with
  their HTTP statuses.
- :mod:`.server`: :class:`~.server.ToxiproxyServer`, the whole thing in a background
  thread (tests, scenarios) or in the foreground (``amq chaos proxy``).
- :mod:`.testing`: small real-socket helpers for tests through a proxy.
"""
