"""The FastAPI app the datagen plugin mounts at ``/datagen`` in the Airflow API server.

Authentication and authorization are Airflow's own: a plugin app gets neither by default, so every
route resolves the user with the API server's ``get_user`` dependency. That resolves the user from an
``Authorization: Bearer`` header or, failing that, from the UI's ``_token`` session cookie (the
cookie is scoped to the API server's base path, so the browser sends it to ``/datagen`` too, which is
how the iframe tab works with the UI's session); no token is 401, a bad one 403.

Experiment pages are authorized per Dag (:mod:`.access`): a user who may read no Dag at all is
refused (403); otherwise the index lists exactly the experiments whose writing Dags the user may
read, and every page, JSON route and blob of another experiment is 403, whether it exists or not (so
a refusal does not tell which names exist). A ``dag_id`` query parameter on the experiment routes is
refused (400): authorization comes from the Dags that wrote the experiment, never from the request.
The task-instance pages carry the dag_id in the path and need read access to that Dag's task
instances (``requires_access_dag``); they list only the experiments the user's experiment pages
would show (a task of a Dag the user may read can write into an experiment another Dag wrote too).

Routes are synchronous on purpose: Lance reads block, and FastAPI runs sync routes in its threadpool.
"""

from __future__ import annotations

import json
import logging
import re
from typing import Annotated, Any

from airflow.api_fastapi.auth.managers.models.resource_details import DagAccessEntity
from airflow.api_fastapi.core_api.security import GetUserDep, requires_access_dag
from fastapi import APIRouter, Depends, FastAPI, HTTPException, Query, Request
from fastapi.responses import HTMLResponse, JSONResponse, Response

from airflow_provider_datagen.exceptions import DatagenError, NotFoundError
from airflow_provider_datagen.plugins import pages
from airflow_provider_datagen.plugins.access import DagAccess
from airflow_provider_datagen.plugins.data import (
    MAX_PAGE_SIZE,
    STATUS_FILTERS,
    Reader,
    conn_id,
    current_reader,
    running_not_failed,
)

logger = logging.getLogger(__name__)

_NO_STORE = {"Cache-Control": "no-store"}
_SAFE_NAME = re.compile(r"[^A-Za-z0-9_.-]")


def _refuse_dag_id_query(request: Request) -> None:
    if "dag_id" in request.query_params:
        raise HTTPException(
            400,
            "dag_id is not a parameter of this route; experiment pages are authorized "
            "against the Dags that wrote the experiment",
        )


def _dag_access(user: GetUserDep) -> DagAccess:
    access = DagAccess.for_user(user)
    # Sync on purpose (FastAPI runs it in the threadpool): FAB's answers may read the metadata DB.
    if not access.may_list():
        raise HTTPException(403, "Forbidden: you may not read any Dag")
    return access


Access = Annotated[DagAccess, Depends(_dag_access)]


def _authorize(reader: Reader, access: DagAccess, pipeline: str, experiment: str) -> None:
    """Refuse (403) an experiment the user may not read, and one that does not exist unless they may
    read all Dags (only they can tell a missing experiment from a forbidden one)."""
    if access.all_dags():
        return
    try:
        writers = reader.writers(pipeline, experiment)
    except NotFoundError:
        writers = None
    if writers is None or not access.may_read(writers):
        raise HTTPException(
            403,
            f"Forbidden: experiment {pipeline!r}/{experiment!r} is not one you may read (its events were "
            "written by Dags you may not read, outside any Dag, or it does not exist)",
        )


def _reader_for(access: DagAccess, pipeline: str, experiment: str) -> Reader:
    reader = _reader()
    _authorize(reader, access, pipeline, experiment)
    return reader


def _urls(request: Request) -> pages.Urls:
    # root_path is the API server's base path plus the mount prefix (/datagen), so links work
    # behind a reverse proxy sub-path too.
    return pages.Urls(request.scope.get("root_path", "") or "")


def _wants_json(request: Request) -> bool:
    prefix = request.scope.get("root_path", "") or ""
    return request.url.path[len(prefix) :].startswith("/api/")


def _html(body: str, status_code: int = 200) -> HTMLResponse:
    return HTMLResponse(body, status_code=status_code, headers=_NO_STORE)


def _reader() -> Reader:
    return current_reader()


def _parse_map_index(raw: str) -> int:
    # The UI substitutes {MAP_INDEX}; if it did not (an old UI, a hand-written URL), treat as unmapped.
    try:
        return int(raw)
    except ValueError:
        return -1


def _with_blob_urls(data: Any, urls: pages.Urls, pipeline: str, experiment: str) -> Any:
    """Add a ``url`` to every blob reference so JSON clients can fetch blobs the way the page does."""
    if isinstance(data, dict):
        out = {k: _with_blob_urls(v, urls, pipeline, experiment) for k, v in data.items()}
        blob = out.get("blob")
        if isinstance(blob, dict) and "event_id" in blob:
            out["blob"] = {**blob, "url": urls.blob(pipeline, experiment, blob["event_id"])}
        return out
    if isinstance(data, list):
        return [_with_blob_urls(v, urls, pipeline, experiment) for v in data]
    return data


def _visible(reader: Reader, access: DagAccess, pipeline: str, experiment: str) -> bool:
    if access.all_dags():
        return True
    try:
        return access.may_read(reader.writers(pipeline, experiment))
    except DatagenError:
        return False  # unreadable: nothing says which Dags wrote it


def _index_data(reader: Reader, access: DagAccess) -> dict[str, Any]:
    experiments = []
    for ref in reader.experiments():
        if not _visible(reader, access, ref.pipeline, ref.experiment):
            continue
        entry: dict[str, Any] = {"pipeline": ref.pipeline, "experiment": ref.experiment}
        try:
            prep = reader.prepared(ref.pipeline, ref.experiment)
        except DatagenError as exc:
            # One unreadable log (newer schema, damaged files) must not hide the others.
            logger.warning("cannot read experiment %s/%s: %s", ref.pipeline, ref.experiment, exc)
            entry["error"] = str(exc)
        else:
            s = prep.summary
            entry["summary"] = s
            entry["running_not_failed"] = running_not_failed(s)
            entry["progress"] = (s["completed"] + s["filtered"]) / s["total"] if s["total"] else 0.0
        experiments.append(entry)
    return {"root": reader.shown_root, "conn_id": conn_id(), "experiments": experiments}


def _ti_data(access: DagAccess, dag_id: str, run_id: str, task_id: str, map_index: str) -> dict[str, Any]:
    """What a task instance wrote, in the experiments the user may read only (the pages' own rule)."""
    reader = _reader()
    return reader.task_instance(
        dag_id,
        run_id,
        task_id,
        _parse_map_index(map_index),
        visible=lambda pipeline, experiment: _visible(reader, access, pipeline, experiment),
    )


def _items_args(
    status: str | None = Query(None, description="lifecycle status, 'failed' or 'violations'"),
    q: str | None = Query(None, max_length=4096, description="case-insensitive substring of the item id"),
    scope: str = Query("roots", description="roots (source items), children (fan-out) or all"),
    version: str | None = Query(None, max_length=4096, description="the items' processor version, exactly"),
    offset: int = Query(0, ge=0),
    limit: int = Query(50, ge=1, le=MAX_PAGE_SIZE),
) -> dict[str, Any]:
    return {
        "status": status or None,
        "q": q or None,
        "scope": scope,
        "version": version or None,
        "offset": offset,
        "limit": limit,
    }


ItemsArgs = Annotated[dict[str, Any], Depends(_items_args)]


def _items(reader: Reader, pipeline: str, experiment: str, args: dict[str, Any]) -> dict[str, Any]:
    try:
        return reader.items(pipeline, experiment, **args)
    except ValueError as exc:
        raise HTTPException(400, str(exc)) from None


def create_app() -> FastAPI:
    """Build the plugin app; called once by the plugin when the API server asks for it."""
    app = FastAPI(
        title="Datagen",
        description="Folded status of datagen experiments: experiments, items, trajectories, blobs.",
        # No unauthenticated schema or docs pages.
        docs_url=None,
        redoc_url=None,
        openapi_url=None,
    )
    _add_error_handlers(app)
    experiments = APIRouter(dependencies=[Depends(_refuse_dag_id_query)])
    _add_experiment_routes(experiments)
    _add_item_routes(experiments)
    task_instances = APIRouter(
        dependencies=[Depends(requires_access_dag(method="GET", access_entity=DagAccessEntity.TASK_INSTANCE))]
    )
    _add_task_instance_routes(task_instances)
    app.include_router(experiments)
    app.include_router(task_instances)
    return app


def _add_error_handlers(app: FastAPI) -> None:
    """Errors as a page for a browser, as JSON for the API routes (and for 401/403 on any route)."""

    @app.exception_handler(NotFoundError)
    def _not_found(request: Request, exc: NotFoundError) -> Response:
        if _wants_json(request):
            return JSONResponse({"detail": str(exc)}, status_code=404)
        return _html(pages.error_page(404, str(exc), _urls(request)), 404)

    @app.exception_handler(DatagenError)
    def _datagen_error(request: Request, exc: DatagenError) -> Response:
        # A damaged log or a misconfigured connection: the message names the thing and the fix.
        logger.warning("datagen UI request %s failed: %s", request.url.path, exc)
        if _wants_json(request):
            return JSONResponse({"detail": str(exc)}, status_code=500)
        return _html(pages.error_page(500, str(exc), _urls(request)), 500)

    @app.exception_handler(HTTPException)
    def _http_error(request: Request, exc: HTTPException) -> Response:
        if _wants_json(request) or exc.status_code in (401, 403):
            return JSONResponse({"detail": exc.detail}, status_code=exc.status_code, headers=exc.headers)
        return _html(pages.error_page(exc.status_code, str(exc.detail), _urls(request)), exc.status_code)


def _add_experiment_routes(experiments: APIRouter) -> None:
    """The index and one experiment's status and items, as pages and JSON."""

    # -- index --------------------------------------------------------------------------------

    @experiments.get("/", response_class=HTMLResponse, summary="All experiments (HTML)")
    def index(request: Request, access: Access) -> HTMLResponse:
        return _html(pages.index_page(_index_data(_reader(), access), _urls(request)))

    @experiments.get("/api/experiments", summary="All experiments with their folded counts")
    def api_index(access: Access) -> JSONResponse:
        return JSONResponse(_index_data(_reader(), access), headers=_NO_STORE)

    # -- experiment ----------------------------------------------------------------------------

    @experiments.get("/experiments/{pipeline}/{experiment}", response_class=HTMLResponse)
    def experiment_page(
        request: Request, pipeline: str, experiment: str, args: ItemsArgs, access: Access
    ) -> HTMLResponse:
        reader = _reader_for(access, pipeline, experiment)
        status = reader.status(pipeline, experiment)
        items = _items(reader, pipeline, experiment, args)
        return _html(pages.experiment_page(status, items, _urls(request), STATUS_FILTERS))

    @experiments.get("/api/experiments/{pipeline}/{experiment}", summary="Folded status of one experiment")
    def api_experiment(pipeline: str, experiment: str, access: Access) -> JSONResponse:
        return JSONResponse(_reader_for(access, pipeline, experiment).status(pipeline, experiment), headers=_NO_STORE)

    @experiments.get("/api/experiments/{pipeline}/{experiment}/items", summary="One page of items")
    def api_items(pipeline: str, experiment: str, args: ItemsArgs, access: Access) -> JSONResponse:
        reader = _reader_for(access, pipeline, experiment)
        return JSONResponse(_items(reader, pipeline, experiment, args), headers=_NO_STORE)


def _add_item_routes(experiments: APIRouter) -> None:
    """One item's trajectory and state, and a blob's bytes."""

    # -- item ----------------------------------------------------------------------------------

    @experiments.get("/experiments/{pipeline}/{experiment}/item", response_class=HTMLResponse)
    def item_page(
        request: Request, pipeline: str, experiment: str, access: Access, id: str = Query(..., min_length=1)
    ) -> HTMLResponse:
        data = _reader_for(access, pipeline, experiment).item(pipeline, experiment, id)
        return _html(pages.item_page(data, _urls(request)))

    @experiments.get("/api/experiments/{pipeline}/{experiment}/item", summary="An item's trajectory and state")
    def api_item(
        request: Request, pipeline: str, experiment: str, access: Access, id: str = Query(..., min_length=1)
    ) -> JSONResponse:
        data = _reader_for(access, pipeline, experiment).item(pipeline, experiment, id)
        return JSONResponse(_with_blob_urls(data, _urls(request), pipeline, experiment), headers=_NO_STORE)

    @experiments.get("/api/experiments/{pipeline}/{experiment}/blob/{event_id}", summary="A blob's bytes")
    def api_blob(pipeline: str, experiment: str, event_id: str, access: Access) -> Response:
        data, meta = _reader_for(access, pipeline, experiment).blob(pipeline, experiment, event_id)
        is_json = meta.get("value_kind") == "json"
        name = _SAFE_NAME.sub("_", f"{meta.get('field') or 'value'}-{event_id[:16]}")
        return Response(
            data,
            media_type="application/json" if is_json else "application/octet-stream",
            headers={
                **_NO_STORE,
                "Content-Disposition": f'attachment; filename="{name}.{"json" if is_json else "bin"}"',
                # Never let a browser sniff user bytes into HTML.
                "X-Content-Type-Options": "nosniff",
            },
        )


def _add_task_instance_routes(task_instances: APIRouter) -> None:
    """What a task instance wrote, for the task-instance tab."""

    # -- task instance -------------------------------------------------------------------------
    # run_id is a path parameter that may span segments: Airflow's default run id pattern has no
    # "/", but [scheduler] allowed_run_id_pattern can allow one, and the UI only percent-encodes it
    # (which the server decodes back to "/"). dag_id and task_id never contain "/".

    @task_instances.get("/ti/{dag_id}/{run_id:path}/{task_id}/{map_index}", response_class=HTMLResponse)
    def ti_page(
        request: Request, dag_id: str, run_id: str, task_id: str, map_index: str, access: Access
    ) -> HTMLResponse:
        data = _ti_data(access, dag_id, run_id, task_id, map_index)
        return _html(pages.ti_page(data, _urls(request)))

    @task_instances.get("/api/ti/{dag_id}/{run_id:path}/{task_id}/{map_index}", summary="What a task instance wrote")
    def api_ti(dag_id: str, run_id: str, task_id: str, map_index: str, access: Access) -> JSONResponse:
        data = _ti_data(access, dag_id, run_id, task_id, map_index)
        return JSONResponse(json.loads(json.dumps(data, default=str)), headers=_NO_STORE)
