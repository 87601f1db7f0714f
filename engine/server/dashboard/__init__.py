"""The web dashboard every member serves on its HTTP (metrics) port.

``routes.py`` answers HTTP: the pages, the static assets of ``static/`` and the JSON API under
``/api/``, with the token checks; ``api.py`` turns an API call into a request of the member
service (so every member answers the same about the cluster's jobs); ``requests.py`` holds
those requests (job detail, jobs overview, a member's share); ``readings.py`` reads a member's
running processors (rates, queue fill, watermarks, Kafka lag per partition) and its process.
"""
