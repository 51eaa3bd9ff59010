"""Distillation data path: the reverse-KL advantages equal their formula on known logprobs; a
teacher with another chat rendering is scored on its own prompt tokens; a teacher with another
vocabulary scores the student's text through its own tokens (totals preserved), or is refused."""

import pytest
import torch

from distill_fixtures import FakeSampler, lossy_tokenizer, other_vocab_tokenizer, retemplated_tokenizer
from rlkit.backends.local.models import load_tokenizer
from rlkit.chat import prompt_tokens
from rlkit.errors import ConfigError
from rlkit.loops.distill import distill_datum, sft_datum
from rlkit.loops.teacher import Teacher, TeacherConfig, char_ends, spread_by_characters, task_prompt_parts
from rlkit.losses import ReverseKLDistillation
from rlkit.tasks.arithmetic import ArithmeticTask


@pytest.fixture(scope="module")
def student_tok():
    return load_tokenizer("tiny")


def test_reverse_kl_advantages_equal_their_formula_on_known_logprobs():
    prompt, completion = [5, 6, 7, 8], [20, 21, 22]
    q = [-0.2, -1.0, -3.0]  # student sampler logprobs
    p = [-0.5, -0.4, -3.0]  # teacher logprobs
    for kl_coef, task_adv in ((1.0, None), (0.5, 0.25)):
        datum = distill_datum(prompt, completion, q, p, task_adv)
        inputs = datum.loss_fn_inputs
        # position P-1+k predicts completion token k and carries its values
        assert inputs["target_tokens"].to_torch().tolist()[3:6] == completion
        assert inputs["weights"].to_torch().tolist() == [0, 0, 0, 1, 1, 1, 0]
        native = ReverseKLDistillation(kl_coef=kl_coef).native_data([datum])[0]
        adv = native.loss_fn_inputs["advantages"].to_torch()
        expected = [-kl_coef * (qi - pi) + (task_adv or 0.0) for qi, pi in zip(q, p)]
        assert adv[3:6].tolist() == pytest.approx(expected)
        # the linearised form agrees: at r = 1 the loss is -sum A_t and reverse_kl its mean
        lp = inputs["logprobs"].to_torch().clone()
        loss, metrics = ReverseKLDistillation(kl_coef=kl_coef)([datum], [lp])
        assert float(loss) == pytest.approx(-sum(expected), abs=1e-6)
        assert metrics["reverse_kl_distillation/reverse_kl:mean"] == pytest.approx(sum(qi - pi for qi, pi in zip(q, p)) / 3)


def test_temperature_input_only_when_sampling_is_tempered():
    assert "temperature" not in distill_datum([1, 2], [3], [-1.0], [-1.0], None, 1.0).loss_fn_inputs
    assert distill_datum([1, 2], [3], [-1.0], [-1.0], None, 0.7).loss_fn_inputs["temperature"].to_torch().tolist() == pytest.approx([0.7] * 3)
    assert sft_datum([1, 2, 3], [4, 5]).loss_fn_inputs["weights"].to_torch().tolist() == [0, 0, 1, 1, 0]


def test_a_teacher_with_another_chat_template_is_scored_on_its_own_prompt_tokens(student_tok):
    task = ArithmeticTask(num_shots=0, num_train=4, num_test=2)
    problem = task.problems("train")[0]
    student_prompt, messages, prefill_ids, prefill_text = task_prompt_parts(task, problem, student_tok)
    assert prefill_text == f"{problem['a']} + {problem['b']} ="
    teacher_tok = retemplated_tokenizer()
    sampler = FakeSampler(teacher_tok)
    teacher = Teacher(sampler, student_tok, TeacherConfig(system_prompt="Reply with the sum only."))
    assert teacher.same_vocab and not teacher.sees_student_prompt
    teacher_prompt = teacher.prompt(messages, prefill_ids, prefill_text)
    own = prompt_tokens(teacher_tok, [{"role": "system", "content": "Reply with the sum only."}, *messages]) + prefill_ids
    assert teacher_prompt == own and teacher_prompt != student_prompt
    assert teacher_tok.decode(teacher_prompt).startswith("### System:\nReply with the sum only.")
    completion = student_tok.encode(" 42", add_special_tokens=False) + [student_tok.convert_tokens_to_ids("<|im_end|>")]
    scores = teacher.score(teacher_prompt, completion).result()
    assert sampler.calls == [teacher_prompt + completion]  # the student's tokens, after the teacher's own prompt
    assert scores == [FakeSampler.value(x) for x in completion]


def test_the_same_rendering_reuses_the_student_prompt(student_tok):
    teacher = Teacher(FakeSampler(student_tok), student_tok, TeacherConfig(base_model="tiny"))
    assert teacher.sees_student_prompt


def test_spread_by_characters_preserves_totals_between_shared_boundaries():
    # text "abcdef": student tokens "ab|cd|ef", teacher tokens "abc|def" -> shared boundaries 0 and 6 only... and none in between
    student, teacher = [2, 4, 6], [3, 6]
    assert spread_by_characters(student, teacher, [-0.9, -0.3]) == pytest.approx([-0.4] * 3)
    # student "a|bc|def", teacher "abc|def": boundary 3 is shared
    assert spread_by_characters([1, 3, 6], [3, 6], [-0.9, -0.3]) == pytest.approx([-0.45, -0.45, -0.3])


def test_a_teacher_with_another_vocabulary_scores_the_students_text_through_its_own_tokens(student_tok):
    teacher_tok = other_vocab_tokenizer()
    sampler = FakeSampler(teacher_tok)
    teacher = Teacher(sampler, student_tok, TeacherConfig(base_model="elsewhere"))
    assert not teacher.same_vocab
    messages = [{"role": "user", "content": "What is 12 + 5?"}]
    teacher_prompt = teacher.prompt(messages, [999], "12 + 5 =")  # prefill ids are the student's: re-encoded as text
    assert teacher_prompt == prompt_tokens(teacher_tok, messages) + teacher_tok.encode("12 + 5 =", add_special_tokens=False)
    text = " 17. The answer is 17."
    im_end = student_tok.convert_tokens_to_ids("<|im_end|>")
    completion = student_tok.encode(text, add_special_tokens=False) + [im_end]
    scores = teacher.score(teacher_prompt, completion).result()
    assert len(scores) == len(completion)
    teacher_ids = teacher_tok.encode(text, add_special_tokens=False)
    teacher_end = teacher_tok.convert_tokens_to_ids("<|im_end|>")
    assert sampler.calls == [teacher_prompt + teacher_ids + [teacher_end]]
    assert sum(scores[:-1]) == pytest.approx(sum(FakeSampler.value(x) for x in teacher_ids))
    assert scores[-1] == FakeSampler.value(teacher_end)
    # off-policy direction: the teacher's sample as student tokens
    assert teacher.to_student(teacher_ids + [teacher_end]) == completion


def test_a_teacher_that_cannot_reproduce_the_students_text_is_refused(student_tok):
    teacher = Teacher(FakeSampler(lossy_tokenizer()), student_tok, TeacherConfig(base_model="wordlevel"))
    completion = student_tok.encode(" zebra 17", add_special_tokens=False)
    with pytest.raises(ConfigError, match=r"teacher: eval problem 3: the teacher's tokenizer cannot reproduce the student's text ' zebra 17' exactly"):
        teacher.score([1, 3], completion, "eval problem 3")


def test_char_ends_mark_partial_characters(student_tok):
    text = "ok é!"
    ids = student_tok.encode(text, add_special_tokens=False)
    ends = char_ends(student_tok, ids, text)
    assert ends[-1] == len(text)
    assert all(e is None or 0 < e <= len(text) for e in ends)


def test_task_reward_advantage_is_group_centred_in_the_loop_formula():
    from rlkit.rl.advantages import compute_advantages

    rewards = [1.0, 0.0, 0.0, 1.0]
    adv = [0.5 * a for a in compute_advantages(rewards, "dr_grpo")]
    assert adv == [0.25, -0.25, -0.25, 0.25]
    d = distill_datum([1, 2], [3, 4], [-1.0, -1.0], [-1.0, -1.0], adv[0])
    native = ReverseKLDistillation().native_data([d])[0].loss_fn_inputs["advantages"].to_torch()
    assert native[1:3].tolist() == [0.25, 0.25]
    assert torch.equal(native[0:1], torch.zeros(1))
