"""torch.save / torch.load of tpu tensors, as CUDA code writes them (issue 20)."""
from __future__ import annotations

import io

import pytest
import torch

import tpu_kernels  # noqa: F401
from tpu_kernels.tensor import TpuTensor


def _roundtrip(obj, **load_kwargs):
    buf = io.BytesIO()
    torch.save(obj, buf)
    buf.seek(0)
    return torch.load(buf, **load_kwargs)


def _model():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Linear(8, 2))


def test_state_dict_default_weights_only_load():
    sd = _model().to("tpu").state_dict()
    back = _roundtrip(sd)                          # weights_only=True is torch's default
    assert list(back) == list(sd)
    for k, v in back.items():
        assert isinstance(v, TpuTensor) and v.device == torch.device("tpu", 0)
        torch.testing.assert_close(v.cpu(), sd[k].cpu(), rtol=0, atol=0)


@pytest.mark.parametrize("where", ["tpu", "tpu:0", torch.device("tpu"), {"tpu:0": "tpu:0"}])
def test_map_location_tpu(where):
    sd = _model().to("tpu").state_dict()
    back = _roundtrip(sd, map_location=where)
    assert all(isinstance(v, TpuTensor) for v in back.values())


@pytest.mark.parametrize("where", ["cpu", torch.device("cpu"), {"tpu:0": "cpu"}])
def test_map_location_cpu_gives_cpu_tensors(where):
    sd = _model().to("tpu").state_dict()
    back = _roundtrip(sd, map_location=where)
    for k, v in back.items():
        assert type(v) is torch.Tensor and v.device.type == "cpu"
        torch.testing.assert_close(v, sd[k].cpu(), rtol=0, atol=0)


@pytest.mark.parametrize("where", ["tpu", "tpu:0", torch.device("tpu", 0), {"cpu": "tpu:0"}])
def test_cpu_checkpoint_to_tpu(where):
    m = _model()
    back = _roundtrip(m.state_dict(), map_location=where)
    fresh = _model().to("tpu")
    fresh.load_state_dict(back)
    x = torch.randn(3, 4)
    torch.testing.assert_close(fresh(x.to("tpu")).cpu(), m(x), rtol=1e-5, atol=1e-6)
    assert all(isinstance(v, TpuTensor) for v in back.values())


def test_views_and_shared_storage_survive():
    x = torch.arange(12.0).to("tpu")
    saved = {"x": x, "row": x.view(3, 4)[1], "col": x.view(3, 4)[:, 2], "t": x.view(3, 4).t()}
    back = _roundtrip(saved)
    for k, v in saved.items():
        assert back[k].shape == v.shape and back[k].stride() == v.stride()
        torch.testing.assert_close(back[k].cpu(), v.cpu(), rtol=0, atol=0)
    back["row"].mul_(-1)                           # one storage again: writes reach x and t
    assert back["x"].cpu()[4:8].tolist() == [-4.0, -5.0, -6.0, -7.0]
    assert back["t"].cpu()[:, 1].tolist() == [-4.0, -5.0, -6.0, -7.0]


def test_views_survive_map_location_cpu_and_cpu_to_tpu():
    x = torch.arange(6.0).to("tpu")
    back = _roundtrip({"x": x, "v": x[2:]}, map_location="cpu")
    back["v"].add_(100)
    assert back["x"].tolist() == [0.0, 1.0, 102.0, 103.0, 104.0, 105.0]
    c = torch.arange(6.0)
    back = _roundtrip({"c": c, "v": c[3:]}, map_location="tpu")
    back["v"].zero_()
    assert back["c"].cpu().tolist() == [0.0, 1.0, 2.0, 0.0, 0.0, 0.0]


def test_tied_weights_stay_tied():
    emb = torch.nn.Embedding(5, 4)
    head = torch.nn.Linear(4, 5, bias=False)
    head.weight = emb.weight
    m = torch.nn.ModuleDict({"emb": emb, "head": head}).to("tpu")
    back = _roundtrip(m.state_dict())
    back["emb.weight"].add_(1)
    torch.testing.assert_close(back["head.weight"].cpu(), back["emb.weight"].cpu())


def test_optimizer_state_and_requires_grad():
    m = _model().to("tpu")
    opt = torch.optim.AdamW(m.parameters(), lr=1e-3)
    m(torch.randn(2, 4, device="tpu")).sum().backward()
    opt.step()
    back = _roundtrip(opt.state_dict())
    m2 = _model().to("tpu")
    opt2 = torch.optim.AdamW(m2.parameters(), lr=1e-3)
    opt2.load_state_dict(back)
    for a, b in zip(opt.state.values(), opt2.state.values()):
        torch.testing.assert_close(a["exp_avg"].cpu(), b["exp_avg"].cpu(), rtol=0, atol=0)
        assert b["exp_avg"].device.type == "tpu"
    p = torch.nn.Parameter(torch.ones(2, device="tpu"))
    q = _roundtrip(p, weights_only=False)
    assert q.requires_grad and q.device.type == "tpu"


def test_whole_module_weights_only_false():
    m = _model().to("tpu")
    back = _roundtrip(m, weights_only=False)
    x = torch.randn(2, 4, device="tpu")
    torch.testing.assert_close(back(x).cpu(), m(x).cpu(), rtol=0, atol=0)
    cpu = _roundtrip(_model(), weights_only=False, map_location="tpu")
    assert all(p.device.type == "tpu" for p in cpu.parameters())


def test_bfloat16_and_int_dtypes():
    saved = {"b": torch.randn(3, dtype=torch.bfloat16).to("tpu"), "i": torch.arange(4).to("tpu")}
    back = _roundtrip(saved)
    for k, v in saved.items():
        assert back[k].dtype == v.dtype
        torch.testing.assert_close(back[k].cpu(), v.cpu(), rtol=0, atol=0)


def test_safetensors_save_file_of_a_tpu_state_dict(tmp_path):
    st = pytest.importorskip("safetensors.torch", reason="safetensors is not installed")
    sd = _model().to("tpu").state_dict()
    path = str(tmp_path / "m.safetensors")
    st.save_file(sd, path)                     # tpu tensors, as CUDA code passes them
    back = st.load_file(path)                  # safetensors' device names are fixed: no "tpu"
    assert sorted(back) == sorted(sd)
    m = _model().to("tpu")
    m.load_state_dict(back)
    for k, v in m.state_dict().items():
        assert v.device.type == "tpu"
        torch.testing.assert_close(v.cpu(), sd[k].cpu(), rtol=0, atol=0)
    assert st.load(st.save(sd)).keys() == sd.keys()


def test_safetensors_save_model_drops_tied_weights(tmp_path):
    """safetensors finds shared tensors by their storage's ``data_ptr()`` (a fake
    address per tpu storage, shared by its views, as CUDA's real one): save_file refuses tied weights and
    save_model keeps one name, as on CUDA."""
    st = pytest.importorskip("safetensors.torch", reason="safetensors is not installed")
    emb = torch.nn.Embedding(5, 4)
    head = torch.nn.Linear(4, 5, bias=False)
    head.weight = emb.weight
    m = torch.nn.ModuleDict({"emb": emb, "head": head}).to("tpu")
    path = str(tmp_path / "tied.safetensors")
    with pytest.raises(RuntimeError, match="Some tensors share memory"):
        st.save_file(m.state_dict(), path)
    st.save_model(m, path)
    assert len(st.load_file(path)) == 1
    fresh = torch.nn.ModuleDict({"emb": torch.nn.Embedding(5, 4), "head": torch.nn.Linear(4, 5, bias=False)})
    fresh.head.weight = fresh.emb.weight
    fresh = fresh.to("tpu")
    st.load_model(fresh, path)
    torch.testing.assert_close(fresh.head.weight.cpu(), emb.weight.cpu(), rtol=0, atol=0)
    x = torch.arange(12.0, device="tpu").reshape(3, 4)
    assert x[1:].data_ptr() == x.data_ptr() + 4 * 4 and x[1:].storage().data_ptr() == x.data_ptr()
    assert torch.ones(2, device="tpu").data_ptr() != x.data_ptr()
