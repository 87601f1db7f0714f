"""``jetwake.connectors``: the folder connectors/, linked into the package as jetwake/connectors.

Imported by the folder's own name from the repository root, it would be a second copy of every
module, with classes unequal to jetwake.connectors's (two ``DAG`` classes, two registries), so that
import fails here, naming the right one.
"""
if __name__ != "jetwake.connectors":
    raise ImportError(f"{__name__!r} is the folder connectors/ of the jetwake repository; "
                      f"import it as 'jetwake.connectors' (pip install -e .)")
