import asyncio

import pytest

from harnessrl.components.engine.base import SamplingParams

GREEDY = SamplingParams(temperature=0.0)


@pytest.fixture(scope="session")
def engine():
    from harnessrl.components.engine.local import LocalEngine

    eng = LocalEngine(max_batch=16)
    yield eng
    eng.close()


@pytest.fixture(scope="session")
def chat(engine):
    def render(question: str) -> list[int]:
        return engine.tokenizer.apply_chat_template([{"role": "user", "content": question}],
                                                    add_generation_prompt=True, tokenize=True,
                                                    return_dict=False)
    return render


def run(coro):
    return asyncio.run(coro)
