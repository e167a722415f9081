"""OpenAI-compatible gateway: FastAPI app (app.py), routes, schemas, SSE, CORS, errors, CLI."""
