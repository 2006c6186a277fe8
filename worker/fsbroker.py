"""The embedded broker: kombu's filesystem transport, made safe for writers, readers and crashes.

kombu's own `filesystem://` transport creates a message file and then writes into it, while a
consumer in another process lists the folder, moves any `*.msg` file away and parses it; it also
deletes a message as soon as a consumer takes it. So a consumer that lists the folder between
the writer's two steps loses the message, and a worker killed while running a job loses the job.
This transport changes the file operations and nothing else:

  put:     write `<name>.msg.part` (invisible to consumers, whose filter is `<queue>.msg`), then
           rename it to `<name>.msg`: a rename is atomic, so a listed message is always complete;
  get:     claim a message by renaming it, inside the same folder, to
           `<name>.msg.<host>-<pid>-<rand>.taken` (atomic: one consumer wins, the rest see it gone);
           the claimed file stays until the message is acknowledged;
  ack:     delete the claimed file; reject or restore also delete it after re-queueing;
  recover: a claimed file whose consumer process is gone (same host, pid no longer alive) is
           renamed back to `<name>.msg` and handed out again. Every channel does this when it
           opens and every `RECOVER_EVERY_S` while it polls;
  bad:     a claimed file that is not a message (not UTF-8 JSON: a foreign or damaged file) is
           renamed to `<name>.msg.bad`, logged, and the next message is read: it would otherwise
           fail every consumer that claims it, once per restart.

benchlab's settings keep the URL `filesystem://`; `worker.celery_app` maps it to this transport.
"""
from __future__ import annotations

import logging
import os
import socket
import uuid
from queue import Empty
from time import monotonic

from kombu.exceptions import ChannelError
from kombu.transport import filesystem, virtual
from kombu.utils.encoding import bytes_to_str, str_to_bytes
from kombu.utils.json import dumps, loads

PART_SUFFIX = ".part"
CLAIMED_SUFFIX = ".taken"
BAD_SUFFIX = ".bad"
CLAIM_PROPERTY = "benchlab_claim"  # where a delivered message remembers its claimed file
RECOVER_EVERY_S = 2.0
log = logging.getLogger(__name__)
_HOST = socket.gethostname().replace("-", "_").replace(".", "_")


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def recover_orphans(folder: str) -> int:
    """Put back the messages claimed by consumers of this host that died before acknowledging them."""
    recovered = 0
    for name in os.listdir(folder):
        if not name.endswith(CLAIMED_SUFFIX):
            continue
        original, _, claim = name[: -len(CLAIMED_SUFFIX)].rpartition(".")
        parts = claim.split("-")
        if len(parts) < 3 or not parts[-2].isdigit():
            continue
        host, pid = "-".join(parts[:-2]), int(parts[-2])
        if host != _HOST or _alive(pid):
            continue
        try:
            os.rename(os.path.join(folder, name), os.path.join(folder, original))
            recovered += 1
        except OSError:
            pass  # another consumer recovered it first
    return recovered


class Channel(filesystem.Channel):
    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self._next_recover = 0.0

    def _put(self, queue, payload, **kwargs):
        if isinstance(payload, dict) and CLAIM_PROPERTY in (payload.get("properties") or {}):
            # a re-queued message is a new file (a copy: the delivered message still needs its claim)
            payload = {**payload, "properties": {k: v for k, v in payload["properties"].items()
                                                 if k != CLAIM_PROPERTY}}
        # the name sorts by time as kombu's does (consumers take the oldest first)
        name = f"{int(round(monotonic() * 1000))}_{uuid.uuid4()}.{queue}.msg"
        final = os.path.join(self.data_folder_out, name)
        part = final + PART_SUFFIX
        try:
            with open(part, "wb") as f:
                f.write(str_to_bytes(dumps(payload)))
            os.replace(part, final)
        except OSError as exc:
            raise ChannelError(f"Cannot add file {final!r} to directory") from exc

    def _get(self, queue):
        now = monotonic()
        if now >= self._next_recover:
            self._next_recover = now + RECOVER_EVERY_S
            recover_orphans(self.data_folder_in)
        wanted = f"{queue}.msg"
        for name in sorted(os.listdir(self.data_folder_in)):
            if name.partition(".")[2] != wanted:
                continue
            path = os.path.join(self.data_folder_in, name)
            claimed = f"{path}.{_HOST}-{os.getpid()}-{uuid.uuid4().hex[:8]}{CLAIMED_SUFFIX}"
            try:
                os.rename(path, claimed)
            except OSError:
                continue  # another consumer claimed it first
            try:
                with open(claimed, "rb") as f:
                    payload = loads(bytes_to_str(f.read()))
            except OSError as exc:
                raise ChannelError(f"Cannot read file {claimed!r} from queue.") from exc
            except ValueError as exc:  # UnicodeDecodeError and JSONDecodeError among them
                os.replace(claimed, path + BAD_SUFFIX)
                log.warning("queue %s: %s is not a message (%s); set aside as %s", queue, name, exc,
                            name + BAD_SUFFIX)
                continue
            if isinstance(payload, dict) and isinstance(payload.get("properties"), dict):
                payload["properties"][CLAIM_PROPERTY] = claimed  # deleted at ack
            else:
                os.remove(claimed)  # not a kombu message: nothing will acknowledge it
            return payload
        raise Empty()

    @staticmethod
    def _release(message) -> None:
        claimed = (getattr(message, "properties", None) or {}).get(CLAIM_PROPERTY)
        if claimed:
            try:
                os.remove(claimed)
            except FileNotFoundError:
                pass

    def basic_ack(self, delivery_tag, multiple=False):
        message = self.qos._delivered.get(delivery_tag)
        super().basic_ack(delivery_tag, multiple=multiple)
        self._release(message)

    def basic_reject(self, delivery_tag, requeue=False):
        message = self.qos._delivered.get(delivery_tag)
        super().basic_reject(delivery_tag, requeue=requeue)  # requeue writes a new file first
        self._release(message)

    def _restore(self, message):
        super()._restore(message)
        self._release(message)


class Transport(filesystem.Transport):
    """kombu shares one table of declared bindings among all filesystem connections of a process; a
    second broker folder in the same process (tests, two stacks) then never gets its bindings
    written, and messages to it are dropped. Each connection keeps its own: declaring again is
    idempotent on disk."""

    Channel = Channel

    def __init__(self, client, **kwargs):
        super().__init__(client, **kwargs)
        self.state = virtual.BrokerState()
