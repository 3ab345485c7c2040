"""LLM answers with the ``postgres`` provider: prompts from a query, answers into a table.

The other storage providers are covered with ``modelVersion: openai`` in
``test_runner_openai`` (``krateo``, ``http``, ``s3``); this is the case of
``examples/llm-chat.yaml``: a query with a ``$day`` parameter and keyset
paging in, a table created on first use out, each answer beside its row's key
and passthrough column, its finish reason and usage as columns of their own.
The model is ``hack.openai_server`` (the ``echo`` model: answers are the last
message reversed, tokens are words); the database is a real PostgreSQL server.
"""

from __future__ import annotations

from typing import Any

from contract.exitcodes import ExitCode
from hack.openai_server import chat_reply
from tests.runner.conftest import World
from tests.runner.pg import JOB, connection, secrets
from tests.servers import Database, OpenAIServer

SYSTEM = {"role": "system", "content": "Answer in two sentences, in the question's language."}


def seed_tickets(db: Database, count: int) -> dict[int, tuple[str, str]]:
    """``count`` tickets on two days, ids not in insertion order; the wanted day's by id."""
    db.execute(
        "CREATE TABLE tickets (id bigint PRIMARY KEY, language text, question text, opened_on date)"
    )
    rows = [
        (
            50_000 - 3 * i,
            "it" if i % 3 == 0 else "en",
            f"question {i} about {'llamas ' * (i % 4 + 1)}".strip(),
            "2026-11-25" if i % 5 == 0 else "2026-11-26",
        )
        for i in range(count)
    ]
    db.execute("INSERT INTO tickets VALUES (%s, %s, %s, %s)", rows)
    return {
        key: (language, question) for key, language, question, day in rows if day.endswith("26")
    }


def llm_contract(server: OpenAIServer, db: Database) -> dict[str, Any]:
    return {
        "jobId": JOB,
        "jobName": "inf-llm-pg-8d2f",
        "kserve": {
            "modelName": "echo",
            "modelUrl": server.base_url,
            "modelVersion": "openai",
            "openai": {
                "request": {"max_tokens": 64, "temperature": 0, "messages": [SYSTEM]},
                "inputColumn": "question",
                "onRowError": "record",
            },
        },
        "input": {
            "postgres": {
                **connection(db),
                "query": "SELECT id, language, question FROM tickets WHERE opened_on = $day",
                "paging": {"pageSize": 50, "key": "id"},
                "keyColumn": "id",
                "passthroughColumns": ["language"],
            }
        },
        "output": {"postgres": {**connection(db), "table": "ticket_answers", "createTable": True}},
        "parameters": {"day": "2026-11-26"},
        "batching": {"concurrency": 8},
    }


async def test_answers_from_a_postgres_query_are_stored_in_a_table_beside_their_keys(
    llm: World, postgres: Database, openai_server: OpenAIServer
) -> None:
    wanted = seed_tickets(postgres, 300)
    outcome = await llm.run(llm_contract(openai_server, postgres), secrets(postgres))
    assert outcome.exit_code == ExitCode.DONE, outcome.termination
    assert outcome.result["rows"] == outcome.result["predictions"] == len(wanted) == 240

    rows: list[Any] = postgres.query(
        "SELECT run_uid, row_index, id, language, prediction, finish_reason, usage, error "
        "FROM ticket_answers ORDER BY row_index"
    )
    assert len(rows) == len(wanted)
    # Keyset paging reads in key order: row_index is the row's place in it.
    assert [r[2] for r in rows] == sorted(wanted)
    assert [r[1] for r in rows] == list(range(len(wanted)))
    for run_uid, _, key, language, prediction, finish_reason, usage, error in rows:
        expected_language, question = wanted[key]
        messages = [SYSTEM, {"role": "user", "content": question}]
        assert run_uid == JOB
        assert language == expected_language
        assert prediction == chat_reply(messages, 64)[0]
        assert finish_reason == "stop"
        assert isinstance(usage, dict)  # a jsonb column: psycopg gives an object back
        assert usage["prompt_tokens"] == len(SYSTEM["content"].split()) + len(question.split())
        assert usage["completion_tokens"] == len(prediction.split())
        assert error is None
    columns: list[Any] = postgres.query(
        "SELECT column_name, data_type FROM information_schema.columns "
        "WHERE table_name = 'ticket_answers'"
    )
    types = dict(columns)
    assert types["usage"] == "jsonb"
    assert types["prediction"] == "text"
    assert (await openai_server.stats())["answered"] == len(wanted)
