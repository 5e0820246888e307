"""Command-line clients of the OpenAI audio front (console scripts, see pyproject.toml):

  tritontts-speak   one text (argument, file or stdin) to an audio file or stdout; or a
                    WebSocket session that speaks stdin line by line as it is typed
  tritontts-batch   every line of a text file, many requests at once: files + summary.json

They speak plain HTTP/WebSocket to `python -m frontend` (or any server with the same API),
so they need none of the serving stack.
"""
