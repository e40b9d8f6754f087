"""A served model's start (`decide.startup`): the start-up request is answered only where graphs are captured."""

from __future__ import annotations

from typedlm.decide.startup import WARM_UP_BODY, warm_up


def test_a_decider_without_cuda_graphs_answers_no_request_of_its_own_at_start(real_decider, capsys):
    # on a CPU nothing is compiled or captured on a first forward: the start-up request would only delay listening
    before = real_decider.prefix_cache.stats()
    warm_up(real_decider)
    assert real_decider.prefix_cache.stats() == before
    assert capsys.readouterr().err == ""


def test_the_start_up_request_is_one_a_client_could_send(real_decider):
    response = real_decider.respond(WARM_UP_BODY)
    assert set(response["answers"]) == set(WARM_UP_BODY["questions"])
