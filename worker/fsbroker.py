"""The embedded broker: kombu's filesystem transport, made safe for a writer and a reader at once.

kombu's own `filesystem://` transport creates a message file and then writes into it, while a
consumer in another process lists the folder, moves any `*.msg` file away and parses it. A consumer
that lists the folder between the two steps takes an empty or half-written file, fails to parse it,
and the message is gone (seen here as a job result that never reached the database). This transport
changes the two file operations and nothing else:

  put: write `<name>.msg.part` (invisible to consumers, whose filter is `<queue>.msg`), then rename
       it to `<name>.msg`: a rename is atomic, so a listed message is always complete;
  get: claim a message by renaming it inside the same folder (atomic: one consumer wins, the rest
       see it gone), then read and delete the claimed file.

benchlab's settings keep the URL `filesystem://`; `worker.celery_app` maps it to this transport.
"""
from __future__ import annotations

import os
import uuid
from queue import Empty
from time import monotonic

from kombu.exceptions import ChannelError
from kombu.transport import filesystem
from kombu.utils.encoding import bytes_to_str, str_to_bytes
from kombu.utils.json import dumps, loads

PART_SUFFIX = ".part"
CLAIMED_SUFFIX = ".taken"


class Channel(filesystem.Channel):
    def _put(self, queue, payload, **kwargs):
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
        wanted = f"{queue}.msg"
        for name in sorted(os.listdir(self.data_folder_in)):
            if name.partition(".")[2] != wanted:
                continue
            path = os.path.join(self.data_folder_in, name)
            claimed = f"{path}.{os.getpid()}-{uuid.uuid4().hex[:8]}{CLAIMED_SUFFIX}"
            try:
                os.rename(path, claimed)
            except OSError:
                continue  # another consumer claimed it first
            try:
                with open(claimed, "rb") as f:
                    payload = f.read()
                os.remove(claimed)
            except OSError as exc:
                raise ChannelError(f"Cannot read file {claimed!r} from queue.") from exc
            return loads(bytes_to_str(payload))
        raise Empty()


class Transport(filesystem.Transport):
    Channel = Channel
