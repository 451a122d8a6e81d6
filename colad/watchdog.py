"""The watchdog's old entry point, kept for installed configurations.

A .deb install keeps /etc/colad/supervisord.conf as a conffile, and the one shipped before the
package layout names `colad.watchdog:make_rpcinterface`; an upgrade that kept it would otherwise
leave supervisord unable to start. The watchdog is colad.supervise.watchdog.
"""

from colad.supervise.watchdog import make_rpcinterface

__all__ = ["make_rpcinterface"]
