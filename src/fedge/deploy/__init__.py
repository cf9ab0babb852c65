"""fedge on Flower's Deployment Runtime: one SuperLink (the server app) and a SuperNode per client.

Install with the ``deploy`` extra (``pip install fedge[deploy]``). ``server_app`` and ``client_app`` are
the Flower apps; ``rounds`` holds the server side of each deployed algorithm, ``node`` the client side
(fedge's own step functions on the node's own data and state), ``wire`` the ArrayRecord payloads and
their checks, ``transport`` the message exchange with timeouts and dropouts, ``launch`` a one-host
launcher (SuperLink + SuperNodes as separate processes, optional TLS and node authentication).
Nothing here is imported by ``import fedge``: Flower stays optional.
"""
