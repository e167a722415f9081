"""Texts for building a static n-gram drafter (engine/bench/draft_sim.py): DISJOINT from the hotpath bench's
10 test texts (engine/bench/hotpath.py TEXTS), so a table built from the model's translations of these is
tested on texts it never saw.

Two sources: short messages of the tray's kind (mails, chat, notes, minutes; zh and en) written for this
file, and prose chunks of the quantizer's calibration text (assets/calibration*.txt, its prose paragraphs
cut into 1-3 sentence pieces; code and chat snippets skipped).
"""
from __future__ import annotations

import re

from engine.assets_path import asset

MESSAGES = [
    "下周一上午九点开部门例会，请大家准备好上个月的工作总结，每人发言不超过五分钟。",
    "快递已经放在小区门口的快递柜里了，取件码是 6132，请在今天晚上八点前取走。",
    "王经理您好，附件是第三季度的销售报表，请您审阅。如有问题请随时联系我。",
    "由于天气原因，原定本周六的户外活动取消，具体改期时间另行通知，给大家带来不便敬请谅解。",
    "妈，我这周末要加班，不回家吃饭了，下周六再回去看你们，记得按时吃药。",
    "报销单请在每月二十五日前交到财务部，逾期的单据将推迟到下个月处理。",
    "各位家长：下周三学校组织学生参观科技馆，请为孩子准备午餐和饮用水，下午四点在校门口接孩子。",
    "我已经把合同的修改意见标在文档里了，主要是付款方式和交货时间两处，请法务再看一下。",
    "新来的实习生小张下周一入职，请行政帮忙准备电脑和门禁卡，并安排他坐在开发组旁边。",
    "提醒：明天早上七点半的航班，六点前必须出发去机场，别忘了带护照和充电器。",
    "本次考试成绩已经公布，请同学们登录教务系统查询，对成绩有疑问的可以在三天内申请复查。",
    "餐厅订好了，周五晚上六点半，四个人，地址是人民路一百二十号二楼，靠窗的位置。",
    "系统升级后，登录密码需要重新设置，新密码至少八位，必须包含字母和数字。",
    "李老师，谢谢您这学期的指导。论文初稿我已经上传到共享文件夹，麻烦您有空的时候看一下。",
    "项目进度：前端页面完成了百分之八十，后端接口还差支付和退款两个模块，预计下周五联调。",
    "小区停水通知：因管道维修，本周四上午八点至下午五点停水，请各位住户提前储水。",
    "你好，我在网上买的耳机左边没有声音，订单号是 20231105，想申请换货，请问需要怎么操作？",
    "会议室的投影仪坏了，已经报修，今天下午的培训改在五楼的大会议室进行。",
    "这个月的电费比上个月多了一百多块，可能是空调开得太多，下个月大家注意节约用电。",
    "年终聚餐定在十二月二十八号晚上，地点待定，有忌口的同事请在本周内告诉我。",
    "Hi team, the stand-up meeting is moved to 9:30 tomorrow because of the all-hands at 9. Please update "
    "your tickets before then.",
    "Your package has been delivered to the front door. If you did not receive it, please contact us within "
    "48 hours.",
    "Dear Professor Liu, I am sorry to miss today's seminar. I have a fever and the doctor told me to stay at "
    "home. I will watch the recording and send my notes by Sunday.",
    "Quick update: the new website goes live on Monday. Marketing will send the newsletter at noon, and "
    "support should expect more questions in the afternoon.",
    "Please remember to lock the back door and switch off the lights when you leave the office tonight.",
    "We are sorry, but your flight to Berlin has been cancelled. You have been rebooked on the 7:45 flight "
    "tomorrow morning.",
    "Minutes: 1) budget approved; 2) hiring two engineers in Q2; 3) next meeting on the 12th at 3 pm.",
    "Hey Tom, can you pick up the kids from school today? I have a meeting that will probably run late.",
    "The printer on the second floor is out of toner again. I ordered a new cartridge, it should arrive on "
    "Wednesday.",
    "Thanks for the interview yesterday. I am very interested in the position and happy to provide any "
    "further information you need.",
    "Reminder: the quarterly report is due this Friday. Send your section to Maria by Thursday noon so she "
    "can merge everything.",
    "The gym will be closed for renovation from June 1 to June 14. Members can use the downtown location "
    "during that time.",
    "I tested the fix on staging and it works, but the page is still slow on mobile. Let's look at the images "
    "next.",
    "Could you send me the invoice for last month's order? Our accounting team needs it before the end of the "
    "week.",
    "Note: water will be shut off on Tuesday from 10 am to 2 pm for pipe repairs in the building.",
    "Dear customer, your subscription will renew automatically on May 3. You can cancel at any time in your "
    "account settings.",
    "Lunch is on me today to celebrate the release. Meet at the Italian place across the street at 12:30.",
    "The meeting notes are in the shared folder. Please add your comments before Friday so we can finalize the "
    "plan.",
    "Hi Sarah, I will be on vacation from August 5 to August 16. Please contact David for anything urgent.",
    "Please fill out the safety training form and return it to HR by the end of the month.",
]


def _cjk(s: str) -> float:
    chars = [c for c in s if not c.isspace()]
    return sum("\u3400" <= c <= "\u9fff" for c in chars) / max(1, len(chars))


def _prose(p: str) -> bool:
    """A prose paragraph: no code or chat markup, mostly CJK or mostly letters."""
    if re.search(r"[{}()\[\];=<>`#|_\\]|^\s*(def|from|import|SELECT|问：|答：)|\bimport\b", p) or p.count("\n") > 1:
        return False
    letters = sum(c.isalpha() for c in p)
    return len(p) >= 40 and (_cjk(p) > 0.5 or letters / len(p) > 0.75)


def calibration_chunks(max_chars_zh: int = 90, max_chars_en: int = 220) -> list[str]:
    """Prose paragraphs of the calibration text cut at sentence ends into pieces of at most ~max_chars."""
    out = []
    for name in ("calibration.txt", "calibration_extra.txt"):
        text = asset(name).read_text(encoding="utf-8")
        for para in (p.strip() for p in text.split("\n\n")):
            if not _prose(para):
                continue
            zh = _cjk(para) > 0.5
            sents = re.findall(r"[^。！？]+[。！？]?" if zh else r"[^.!?]+[.!?]?\s*", para)
            cur = ""
            for s in sents:
                if cur and len(cur) + len(s) > (max_chars_zh if zh else max_chars_en):
                    out.append(cur.strip())
                    cur = ""
                cur += s
            if len(cur.strip()) >= 20:
                out.append(cur.strip())
    return out


def train_texts() -> list[str]:
    return MESSAGES + calibration_chunks()


HELD_PER_LANGUAGE = 20  # the first texts of each hand-written list: evaluation only, never trained on


def hand_texts(split: str) -> list[str]:
    """Hand-written texts of the tray's kind (engine/bench/hand_texts_zh.py / _en.py, 160 each, written like the
    messages people select: names, dates, amounts, lists), disjoint from the hot-path bench's. split "held": the
    first HELD_PER_LANGUAGE of each language (zh first), the draft heads' held-out set; "train": the rest."""
    from engine.bench.hand_texts_en import TEXTS_EN
    from engine.bench.hand_texts_zh import TEXTS_ZH
    n = HELD_PER_LANGUAGE
    if split == "held":
        return TEXTS_ZH[:n] + TEXTS_EN[:n]
    if split == "train":
        return TEXTS_ZH[n:] + TEXTS_EN[n:]
    raise ValueError(f"split must be 'held' or 'train', not {split!r}")
