"""The async SDK, whose directory watch uses the streaming WatchDir RPC."""

import asyncio

from e2b import AsyncSandbox, FilesystemEventType


def test_async_commands_files_and_streaming_watch(shared_agent):
    async def scenario():
        sbx = shared_agent.sandbox(cls=AsyncSandbox)
        result = await sbx.commands.run("echo async")
        assert result.stdout == "async\n"
        await sbx.files.make_dir("awatch")
        seen = []
        got_events = asyncio.Event()

        def on_event(event):
            seen.append((event.name, event.type))
            if ("f.txt", FilesystemEventType.CREATE) in seen:
                got_events.set()

        handle = await sbx.files.watch_dir("awatch", on_event=on_event)
        try:
            await sbx.files.write("awatch/f.txt", "x")
            await asyncio.wait_for(got_events.wait(), timeout=30)
        finally:
            await handle.stop()
        assert await sbx.files.read("awatch/f.txt") == "x"

    asyncio.run(scenario())
