"""fedge on Flower's Deployment Runtime: one SuperLink (the server app) and a SuperNode per client.

Install with the ``deploy`` extra (``pip install fedge[deploy]``). ``server_app`` and ``client_app`` are
the Flower apps; ``rounds`` says which algorithms deploy (their own rounds, on the ``executor``: the
remote executor that trains each row on its client's node), ``split_rounds`` the deployed split rounds,
``node`` the client side (fedge's own executor and step functions on the node's own data and state),
``wire`` the ArrayRecord payloads and their checks, ``transport`` the message exchange with timeouts and
dropouts, ``loopback`` an in-process transport with the same records and checks, ``launch`` a one-host
launcher (SuperLink + SuperNodes as separate processes, optional TLS and node authentication),
``app_process`` long-lived ClientApp and ServerApp processes (a node builds the run once, not per message).
Nothing here is imported by ``import fedge``: Flower stays optional.
"""
